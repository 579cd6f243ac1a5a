"""LookaheadAblation on the tiny Llama: siblings equal separate fits, resume, TensorBoard series, export, summary."""

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lkv.eviction.presses.lookaheadkv
import lkv.train.module
from lkv.core.generation import prefill
from lkv.eviction.presses.lookaheadkv import load_lookahead
from lkv.model.lookahead import CONFIG_FILE
from lkv.model.probe import PROBE_CONFIG_FILE, PROBE_SUBFOLDER, PROBE_WEIGHTS_FILE
from lkv.sweep.ablation import LookaheadAblation
from lkv.sweep.grid import grid_points, point_name
from lkv.train.datamodule import LabelDataModule
from lkv.train.export import export_checkpoint
from lkv.train.module import LookaheadKVModule
from lkv.train.probe_head import ProbeSettings
from tests.conftest import TINY, build_tiny_model

# three siblings beside the main module (M = 4, all-linear): no LoRA, LoRA on q+v, LoRA on every linear layer
SIBLINGS = {"num_lookahead": [6], "lora_targets": ["none", ["q_proj", "v_proj"], "all-linear"]}
VAL_METRICS = ("val/kl", "val/recall@4", "val/recall@8", "val/kendall_tau")
# the two-phase tests' tolerance (predict vs a full eager forward)
ATOL = 1e-5


class Kill(L.Callback):
    """Stops the fit with an error at the start of global step ``step`` (after step ``step`` − 1 was saved)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


def fit(
    root: Path,
    folders: dict[str, Path],
    max_steps: int,
    ablation: LookaheadAblation | None = None,
    ckpt_path: str | None = None,
    callbacks: tuple[L.Callback, ...] = (),
    accumulate: int = 1,
    **settings: Any,
) -> tuple[L.Trainer, LookaheadKVModule]:
    """A fit of the tiny module (``settings`` over :data:`TINY`), validation every 2 batches, every step logged."""
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=TensorBoardLogger(root, name="tb", version=0),
        callbacks=[
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, every_n_train_steps=1),
            *([ablation] if ablation is not None else []),
            *callbacks,
        ],
        val_check_interval=2 * accumulate,
        accumulate_grad_batches=accumulate,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = LookaheadKVModule(model="tiny", **{**TINY, **settings})
    data = LabelDataModule(train=str(folders["train"]), val=str(folders["val"]))
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer, module


def scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar series of ``root/tb/version_0`` as ``(step, value)`` lists."""
    events = EventAccumulator(str(root / "tb" / "version_0"), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def ablation(root: Path, grid: dict[str, list[Any]] = SIBLINGS) -> LookaheadAblation:
    return LookaheadAblation(grid=grid, output=str(root / "ablation"), overhead_tokens=16, overhead_repeats=1)


def assert_siblings_match_separate_fits(
    got: dict[str, list[tuple[int, float]]], separate: dict[str, dict[str, list[tuple[int, float]]]]
) -> None:
    """Each point's ``ablation/<point>/...`` series equal the separate fit's ``train/loss`` and ``val/...``."""
    for name, want in separate.items():
        for metric in ("train/loss", *VAL_METRICS):
            mine = got[f"ablation/{name}/{metric}"]
            theirs = want[metric]
            assert [s for s, _ in mine] == [s for s, _ in theirs], (name, metric)
            torch.testing.assert_close(
                torch.tensor([v for _, v in mine]),
                torch.tensor([v for _, v in theirs]),
                atol=ATOL,
                rtol=0,
                msg=lambda m, n=name, k=metric: f"{n} {k}: {m}",
            )


@pytest.fixture(scope="module")
def separate_fits(label_folders, tmp_path_factory) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Point name → the TensorBoard series of a plain fit of that variant alone (4 steps, same data order)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lkv.train.module, "load_backbone", lambda model, **kw: build_tiny_model("llama"))
        runs = {}
        for values in grid_points(SIBLINGS):
            root = tmp_path_factory.mktemp("alone")
            fit(root, label_folders, max_steps=4, **values)
            runs[point_name(values)] = scalars(root)
    return runs


def test_siblings_equal_separate_fits(tiny_backbone, label_folders, separate_fits, tmp_path):
    callback = ablation(tmp_path)
    fit(tmp_path, label_folders, max_steps=4, ablation=callback)
    got = scalars(tmp_path)
    assert_siblings_match_separate_fits(got, separate_fits)
    # the siblings really trained apart from the main module and from each other
    finals = {name: got[f"ablation/{name}/val/kl"][-1][1] for name in separate_fits}
    assert len({round(v, 6) for v in [*finals.values(), got["val/kl"][-1][1]]}) == 4, finals


class OffByOne(LookaheadAblation):
    """Hands the siblings the previous batch's prefills instead of this batch's (the first batch: its own)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        previous = getattr(self, "_previous", outputs["prefills"])
        self._previous = outputs["prefills"]
        super().on_train_batch_end(trainer, pl_module, {**outputs, "prefills": previous}, batch, batch_idx)


def test_the_check_sees_other_batches(tiny_backbone, label_folders, separate_fits, tmp_path):
    # the equivalence check fails when the siblings are trained on other batches than the main module
    callback = OffByOne(grid=SIBLINGS, output=str(tmp_path / "ablation"), overhead_tokens=0)
    fit(tmp_path, label_folders, max_steps=4, ablation=callback)
    with pytest.raises(AssertionError, match="train/loss"):
        assert_siblings_match_separate_fits(scalars(tmp_path), separate_fits)


# the main module's own point (M = 4, all-linear) is in this grid: it is the main module, not a sibling
WITH_MAIN = {"num_lookahead": [4, 6], "lora_targets": ["none", "all-linear"]}


def test_a_killed_run_resumes_every_sibling(tiny_backbone, label_folders, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _, module = fit(whole, label_folders, max_steps=5, ablation=(want := ablation(whole, WITH_MAIN)))
    with pytest.raises(RuntimeError, match="killed"):
        fit(killed, label_folders, max_steps=5, ablation=ablation(killed, WITH_MAIN), callbacks=(Kill(3),))
    saved = torch.load(killed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3
    state = next(v for k, v in saved["callbacks"].items() if k.startswith("LookaheadAblation"))
    assert set(state["points"]) == {point_name(v) for v in grid_points(WITH_MAIN)}
    for name, entry in state["points"].items():
        if name == "num_lookahead=4,lora_targets=all-linear":  # the main module: in the module's own state
            assert "weights" not in entry
        else:
            assert entry["weights"] and entry["optimizer"]["state"] and entry["scheduler"]["last_epoch"] == 3
    _, resumed_module = fit(
        killed, label_folders, max_steps=5, ablation=(got := ablation(killed, WITH_MAIN)), ckpt_path="last"
    )
    for mine, theirs in zip(got.points, want.points, strict=True):
        assert mine.name == theirs.name
        if theirs.adapter is None:
            continue
        torch.testing.assert_close(
            dict(mine.adapter.trainable_parameters()),
            dict(theirs.adapter.trainable_parameters()),
            atol=ATOL,
            rtol=0,
            msg=lambda m, n=mine.name: f"{n}: {m}",
        )
        assert mine.optimizer.state_dict()["state"][0]["step"] == 5
    torch.testing.assert_close(
        dict(resumed_module.adapter.trainable_parameters()), dict(module.adapter.trainable_parameters())
    )


def test_tensorboard_export_and_summary(tiny_backbone, label_folders, tmp_path, monkeypatch):
    fit(tmp_path, label_folders, max_steps=4, ablation=(callback := ablation(tmp_path, WITH_MAIN)))
    got = scalars(tmp_path)
    names = [point_name(v) for v in grid_points(WITH_MAIN)]
    # one series per point per metric, each with one value per validation (steps 2 and 4) or training step
    for name in names:
        for metric in VAL_METRICS:
            assert [s for s, _ in got[f"ablation/{name}/{metric}"]] == [1, 3], (name, metric)
    ablated = {tag.split("/")[1] for tag in got if tag.startswith("ablation/")}
    assert ablated == set(names)
    main = "num_lookahead=4,lora_targets=all-linear"
    assert got[f"ablation/{main}/val/kl"] == got["val/kl"]
    siblings = [n for n in names if n != main]
    assert all(len(got[f"ablation/{n}/train/loss"]) == 4 for n in siblings)

    output = tmp_path / "ablation"
    summary = (output / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + len(names)
    header = summary[0].split(",")
    assert {"point", "num_lookahead", "lora_targets", "overhead", "val/recall@8"} <= set(header)
    assert (output / "plots" / "score_vs_size.png").stat().st_size > 0
    assert (output / "plots" / "overhead_vs_size.png").stat().st_size > 0
    assert "| num_lookahead | lora_targets |" in (output / "summary.md").read_text()

    # every point's adapter folder loads as `lkv eval --adapter` does, and predicts as it did in the fit
    monkeypatch.setattr(
        lkv.eviction.presses.lookaheadkv, "load_backbone", lambda model, **kw: build_tiny_model("llama")
    )
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(0))
    for point in callback.points:
        model, _, press = load_lookahead(str(output / "adapters" / point.name), model="tiny")
        assert press.adapter.config.num_tokens == point.values["num_lookahead"]
        assert press.adapter.config.uses_lora == (point.values["lora_targets"] == "all-linear")
        assert (
            press.adapter.config.extra["setting"] == "aware"
        )  # its labels' setting, as `lkv export` writes it
        if point.adapter is not None:
            with torch.no_grad():
                want = point.adapter.predict(prefill(point.adapter.model, ids)[0], 40)
                got = press.adapter.predict(prefill(model, ids)[0], 40)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_the_shipped_ablation_runs_the_sweeps_grid_and_recipe():
    root = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((root / "configs/ablations/lookahead_targets_smollm2.yaml").read_text())
    sweep = yaml.safe_load((root / "configs/sweeps/lookahead_targets_smollm2.yaml").read_text())
    base = yaml.safe_load((root / sweep["base"]).read_text())
    (callback,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("LookaheadAblation")]
    args = callback["init_args"]
    assert {f"model.{k}": v for k, v in args["grid"].items()} == sweep["grid"]
    assert (args["score"], args["overhead_tokens"], args["overhead_repeats"]) == (
        sweep["score"],
        sweep["overhead_tokens"],
        sweep["overhead_repeats"],
    )
    for key, value in sweep["overrides"].items():
        node = config
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    # everything else is the base recipe
    assert {**config["model"], "optim": {**config["model"]["optim"], "warmup_steps": None}} == {
        **base["model"],
        "optim": {**base["model"]["optim"], "warmup_steps": None},
    }
    assert config["data"] == base["data"]
    # the callback instantiates from its YAML arguments (no model is loaded)
    assert len(LookaheadAblation(**args).values) == 12


@pytest.mark.parametrize(
    "settings", [{"max_position_offset": 3000}, {"topc_loss_weight": 1.0, "topc_loss_budget": 4}]
)
def test_a_training_step_setting_sibling_equals_its_separate_fit(
    tiny_backbone, label_folders, tmp_path, settings
):
    """A grid over settings of the training step, not of the module (the position offset, the loss): the sibling
    trains as a fit of that variant alone, and the setting reaches its loss (it differs from the main module's)."""
    fit(tmp_path / "alone", label_folders, max_steps=4, **settings)
    grid = {key: [value] for key, value in settings.items()}
    fit(tmp_path / "grid", label_folders, max_steps=4, ablation=ablation(tmp_path / "grid", grid))
    got = scalars(tmp_path / "grid")
    name = point_name(settings)
    assert_siblings_match_separate_fits(got, {name: scalars(tmp_path / "alone")})
    main = torch.tensor([v for _, v in got["train/loss"]])
    variant = torch.tensor([v for _, v in got[f"ablation/{name}/train/loss"]])
    assert (main - variant).abs().max() > 1e-4


def test_a_copy_boost_sibling_equals_its_separate_fit_on_responses_that_copy(
    tiny_backbone, label_folders, tmp_path
):
    """``copy_boost`` reads each sample's prompt and response: the sibling gets the batch's own samples (its loss
    differs from the main module's where responses copy a prompt run, as in the ``copied`` folder)."""
    folders = {"train": label_folders["copied"], "val": label_folders["val"]}
    fit(tmp_path / "alone", folders, max_steps=4, copy_boost=0.5)
    fit(tmp_path / "grid", folders, max_steps=4, ablation=ablation(tmp_path / "grid", {"copy_boost": [0.5]}))
    got = scalars(tmp_path / "grid")
    assert_siblings_match_separate_fits(got, {"copy_boost=0.5": scalars(tmp_path / "alone")})
    main = torch.tensor([v for _, v in got["train/loss"]])
    variant = torch.tensor([v for _, v in got["ablation/copy_boost=0.5/train/loss"]])
    assert (main - variant).abs().max() > 1e-4


def test_siblings_train_on_the_main_modules_gapped_prefill(tiny_backbone, label_folders, tmp_path):
    """With a position gap the shared prefill is gapped: a sibling (here M = 6) trains as a fit of that variant
    with the same gap draws (same seed) alone."""
    fit(tmp_path / "alone", label_folders, max_steps=4, max_position_gap=300, num_lookahead=6)
    grid = {"num_lookahead": [6]}
    fit(
        tmp_path / "grid",
        label_folders,
        max_steps=4,
        ablation=ablation(tmp_path / "grid", grid),
        max_position_gap=300,
    )
    assert_siblings_match_separate_fits(
        scalars(tmp_path / "grid"), {"num_lookahead=6": scalars(tmp_path / "alone")}
    )
    with pytest.raises(ValueError, match="not lookahead module settings"):
        LookaheadAblation(grid={"max_position_gap": [300]})


def test_a_joint_fits_points_are_written_with_its_probe_and_preset(tiny_backbone, label_folders, tmp_path):
    # a module trained beside a probe exports as module + probe/ at the fit's preset; every sibling point is
    # written the same way, so `lkv eval --adapter <point>` runs the preset with only the module changed
    probe = ProbeSettings(hidden_dim=8, seed=3)
    fit(
        tmp_path,
        label_folders,
        max_steps=2,
        ablation=ablation(tmp_path, {"num_lookahead": [4, 6]}),
        probe=probe,
    )
    export_checkpoint(tmp_path / "checkpoints" / "last.ckpt", tmp_path / "export")
    want = {p.name: p.read_bytes() for p in (tmp_path / "export" / PROBE_SUBFOLDER).iterdir()}
    assert set(want) == {PROBE_CONFIG_FILE, PROBE_WEIGHTS_FILE}
    for values in grid_points({"num_lookahead": [4, 6]}):
        folder = tmp_path / "ablation" / "adapters" / point_name(values)
        got = {p.name: p.read_bytes() for p in (folder / PROBE_SUBFOLDER).iterdir()}
        assert got == want, folder
        extra = json.loads((folder / CONFIG_FILE).read_text())["extra"]
        assert extra == {"model": "tiny", "preset": "long", "setting": "aware"}, folder
