"""TensorBoard summaries any stage writes: scalars with a card description, captioned figures, HParams sessions.

Plain TensorBoard protos through torch's event writer, nothing from Lightning: training logs them through its
logger's writer (:mod:`lkv.train`), `lkv eval` writes its own runs (:mod:`lkv.eval.tensorboard`), and a sweep
rewrites each point's session (:mod:`lkv.sweep.summary`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util.tensor_util import make_tensor_proto
from torch.utils.tensorboard.summary import hparams, image
from torch.utils.tensorboard.writer import FileWriter

SESSION_SUFFIX = ".session"  # event files that `rewrite_session` owns


def scalar(tag: str, value: float, description: str = "") -> Summary:
    """A scalar summary with a card description (TensorBoard shows it under the card's info icon).

    Written as a tensor with the scalars plugin's metadata (TensorBoard's own summary format): TensorBoard's
    default (Rust) loader drops the description of old-style ``simple_value`` scalars.
    """
    metadata = scalar_metadata.create_summary_metadata(display_name=tag, description=description)
    tensor = make_tensor_proto(np.float32(value))
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])


def figure_summary(tag: str, fig: Figure, description: str) -> Summary:
    """An image summary of ``fig`` at its own size (pixels = inches × dpi), with a card description."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3]  # (height, width, 3) uint8
    summary = image(tag, pixels, dataformats="HWC")
    summary.value[0].metadata.summary_description = description
    return summary


def hparam_value(value: Any) -> str | float | int | bool:
    """A value the HParams plugin can show: numbers, text and booleans as they are, lists joined by ``+``
    (``[q_proj, v_proj]`` → ``q_proj+v_proj``), anything else as text."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return "+".join(str(hparam_value(v)) for v in value)
    return str(value)


def hparams_session(
    params: Mapping[str, Any],
    metrics: Iterable[str],
    domains: Mapping[str, Sequence[Any]] | None = None,
) -> list[Summary]:
    """The HParams plugin's experiment, session-start and session-end summaries of one run.

    The plugin takes each metric's value from the run's own scalar of that tag (its last step), so the
    metrics are named here, never logged as extra points.

    Args:
        params: hyper-parameter name → value (passed through :func:`hparam_value`).
        metrics: scalar tags that are this run's results, e.g. ``val/recall@64``.
        domains: hyper-parameter name → every value it takes (a sweep's grid), shown as a discrete domain.
    """
    values = {name: hparam_value(v) for name, v in params.items()}
    discrete = {
        name: [hparam_value(v) for v in options]
        for name, options in (domains or {}).items()
        if name in values and all(type(hparam_value(v)) is type(values[name]) for v in options)
    }
    experiment, start, end = hparams(values, dict.fromkeys(metrics, 0.0), discrete)
    return [experiment, start, end]


def rewrite_session(
    run: str | Path,
    params: Mapping[str, Any],
    metrics: Sequence[str],
    scalars: Mapping[str, float],
    domains: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """(Re)write the one event file of ``run`` that this function owns (suffix ``.session``): an HParams
    session (:func:`hparams_session`) and ``scalars`` at step 0 — results measured outside the run's own
    logging, e.g. a sweep point's eval scores. Earlier ``.session`` files of ``run`` are removed first, so a
    rewrite never adds points; the run's other event files are left alone."""
    run = Path(run)
    for old in run.glob(f"events.out.tfevents.*{SESSION_SUFFIX}"):
        old.unlink()
    writer = FileWriter(str(run), filename_suffix=SESSION_SUFFIX)
    try:
        for summary in hparams_session(params, metrics, domains):
            writer.add_summary(summary, 0)
        for tag, value in scalars.items():
            writer.add_summary(scalar(tag, value), 0)
    finally:
        writer.close()
