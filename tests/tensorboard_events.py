"""Readers of TensorBoard event files, with TensorBoard's own event reader (what a researcher would see)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.util.tensor_util import make_ndarray


def runs(root: Path) -> dict[str, EventAccumulator]:
    """Every TensorBoard run (a folder holding event files) under ``root``, by its path relative to ``root``."""
    folders = sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    return {
        str(folder.relative_to(root)): EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
        for folder in folders
    }


def points_per_step(root: Path) -> Counter:
    """Number of scalar points per (run, tag, step) under ``root``, old-style (``simple_value``) and
    tensor scalars alike."""
    counts: Counter = Counter()
    for run, events in runs(root).items():
        for tag in events.Tags()["scalars"]:
            counts.update((run, tag, e.step) for e in events.Scalars(tag))
        for tag in events.Tags()["tensors"]:
            counts.update((run, tag, e.step) for e in events.Tensors(tag))
    return counts


def scalars(events: EventAccumulator) -> list[str]:
    """Tags of the scalar plugin's series in a run (tensor scalars and old-style ones)."""
    tensors = [
        t for t in events.Tags()["tensors"] if events.SummaryMetadata(t).plugin_data.plugin_name == "scalars"
    ]
    return sorted([*events.Tags()["scalars"], *tensors])


def curve(events: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a tensor scalar series, values rounded to 6 digits."""
    return [(e.step, round(make_ndarray(e.tensor_proto).item(), 6)) for e in events.Tensors(tag)]


def hparams_plugin_data(events: EventAccumulator) -> tuple[list[str], dict[str, object]]:
    """The metric names of a run's HParams experiment and the hyper-parameters of its session."""
    experiment = hparams_metadata.parse_experiment_plugin_data(
        events.SummaryMetadata(hparams_metadata.EXPERIMENT_TAG).plugin_data.content
    )
    start = hparams_metadata.parse_session_start_info_plugin_data(
        events.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data.content
    )
    values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    return [m.name.tag for m in experiment.metric_infos], values
