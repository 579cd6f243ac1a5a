"""Scale-out through Lightning's own launcher: `lkv label` and `lkv fit` as two CPU processes (DDP, gloo).

Each run is the real `lkv` command in a subprocess; with ``--devices 2 --strategy ddp`` Lightning starts
the second process itself. The helpers here (a tiny model saved to a folder, label and fit commands, a
loss-recording callback) are shared with ``test_interruption.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from lkv.cli import main as lkv_main
from lkv.labels.shards import shard_files
from lkv.model.backbone import load_backbone
from tests.cli.conftest import (
    assert_labels_match_one_process,
    fit_config,
    fit_settings,
    label_args,
    make_workspace,
    read_losses,
    run_lkv,
    shard_ids,
    trained_weights,
)
from tests.conftest import make_label_folder

pytestmark = pytest.mark.multiprocess


class RecordLosses(L.Callback):
    """Appends one JSON line per training batch to ``{folder}/losses-r{rank}.jsonl``: the global step the
    batch trained at, its sample ids and its (un-normalised) loss."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Lightning hands back loss / accumulate_grad_batches; undo that to get the batch's own loss.
        loss = float(outputs["loss"]) * trainer.accumulate_grad_batches
        record = {"step": trainer.global_step, "ids": [s["id"] for s in batch], "loss": loss}
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"losses-r{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")


class RecordValidation(L.Callback):
    """Appends one JSON line per validation run to ``{folder}/val-r{rank}.jsonl``: the global step and every
    logged ``val/`` metric as this rank sees it."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_validation_end(self, trainer, pl_module) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"val-r{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps({"step": trainer.global_step, "metrics": metrics}) + "\n")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("scale"))


def test_two_process_label_covers_every_prompt_exactly_once(workspace, tmp_path):
    out = tmp_path / "labels"
    prompts = workspace / "prompts.jsonl"
    run_lkv(label_args(workspace, out, prompts, devices=2, strategy="ddp"), cwd=tmp_path)
    ranks = {path.name.split("-")[1] for path in shard_files(out)}
    assert ranks == {"r000", "r001"}  # each rank wrote its own shards
    ids = shard_ids(out)
    assert sorted(ids) == sorted(f"q{i}" for i in range(8)) and len(ids) == len(set(ids))
    assert_labels_match_one_process(workspace, out, prompts)


def test_two_process_fit_matches_one_process_with_the_same_global_batch(workspace, tmp_path):
    # One process: micro-batches of 1, two per optimiser step. Two DDP processes: one sample each per step,
    # gradients averaged. Both take the mean gradient of samples (2k, 2k+1) at step k, so every sample's
    # loss and the final weights must agree.
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    lkv_main(["fit", "--config", str(fit_config(workspace, single, max_steps=3, accumulate=2))])
    run_lkv(
        [
            "fit",
            "--config",
            str(fit_config(workspace, ddp, max_steps=3)),
            "--trainer.devices=2",
            # plain DDP: every trainable weight gets a gradient (no LoRA on the last layer's v/o/MLP)
            "--trainer.strategy=ddp",
        ],
        cwd=tmp_path,
    )
    reference = {r["ids"][0]: r for r in read_losses(single)[0]}
    per_rank = read_losses(ddp)
    assert sorted(per_rank) == [0, 1]
    seen = [i for records in per_rank.values() for r in records for i in r["ids"]]
    assert sorted(seen) == sorted(reference) and len(reference) == 6  # the ranks split the samples
    for rank, records in per_rank.items():
        assert [r["step"] for r in records] == [1, 2, 3], rank
        for record in records:
            want = reference[record["ids"][0]]
            assert record["loss"] == pytest.approx(want["loss"], rel=1e-4), (rank, record, want)
    single_step, single_weights = trained_weights(single)
    ddp_step, ddp_weights = trained_weights(ddp)
    assert single_step == ddp_step == 3
    assert single_weights.keys() == ddp_weights.keys()
    for name, weight in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], weight, atol=1e-5, rtol=1e-4, msg=name)


def test_two_process_streamed_fit_with_uneven_rows_keeps_the_ranks_in_step(workspace, tmp_path):
    # 9 training rows in 3 shards and 3 validation rows over 2 ranks: split naively, one rank streams 5
    # training rows and the other 4, so with 2 micro-batches per step they disagree on the step count and
    # their collectives pair up wrongly or hang. Each rank must stream floor(9 / 2) = 4 rows per epoch.
    model, tokenizer = load_backbone(str(workspace / "model"))
    make_label_folder(model, tokenizer, tmp_path / "train9", num=9, shard_size=3)
    make_label_folder(model, tokenizer, tmp_path / "val3", num=3, seed=1, shard_size=2)
    run = tmp_path / "ddp"
    settings = fit_settings(workspace, run, max_steps=-1, accumulate=2, shuffle=True)
    settings["trainer"].update({"max_epochs": 2, "check_val_every_n_epoch": 1})
    settings["model"]["optim"]["scheduler"] = (
        "constant"  # (a stream without a length could not size a cosine)
    )
    settings["trainer"]["callbacks"].append(
        {"class_path": "tests.cli.test_distributed.RecordValidation", "init_args": {"folder": str(run)}}
    )
    settings["data"].update(
        {
            "train": str(tmp_path / "train9"),
            "val": str(tmp_path / "val3"),
            "streaming": True,
            "shuffle_buffer": 2,
        }
    )
    run.mkdir()
    config = run / "fit.yaml"
    config.write_text(yaml.safe_dump(settings))
    strategy = "--trainer.strategy=ddp_find_unused_parameters_true"
    run_lkv(["fit", "--config", str(config), "--trainer.devices=2", strategy], cwd=tmp_path, timeout=240)
    losses = read_losses(run)
    assert sorted(losses) == [0, 1]
    for rank, records in losses.items():
        # 4 micro-batches per epoch, 2 per optimiser step: steps 0,1,1,2 | 2,3,3,4 as seen after each batch
        assert [r["step"] for r in records] == [0, 1, 1, 2, 2, 3, 3, 4], rank
    ids = [[i for r in losses[rank] for i in r["ids"]] for rank in (0, 1)]
    # two epochs over the same 4-row slice per rank, disjoint between the ranks, reshuffled per epoch
    for rank_ids in ids:
        assert sorted(rank_ids[:4]) == sorted(rank_ids[4:]) and len(set(rank_ids)) == 4
    assert not set(ids[0]) & set(ids[1])
    validation = read_losses(run, "val")
    assert [r["step"] for r in validation[0]] == [r["step"] for r in validation[1]] == [2, 4]
    for first, second in zip(validation[0], validation[1], strict=True):
        assert first["metrics"] and first["metrics"] == second["metrics"]
