"""Exact resumption of `lkv fit`: a fit resumed from any checkpoint, mid-epoch or at an epoch's end, trains
the batches an uninterrupted run trains at the same steps, in the same order, on every rank; and it logs into
the TensorBoard run folder of the run it resumes.

The fits here use the defaults that made resuming lose its place: a cosine schedule sized from
``max_epochs`` (Lightning builds the training loader for it before reading the checkpoint), shuffling, a
validation folder and gradient accumulation; the training folder holds 9 rows, which 2 ranks cannot split
evenly.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L
import pytest
import yaml

from lkv.cli import main as lkv_main
from lkv.model.backbone import load_backbone
from tests.cli.conftest import (
    fit_settings,
    make_workspace,
    read_losses,
    run_lkv,
    start_lkv,
    trained_weights,
)
from tests.conftest import make_label_folder
from tests.tensorboard_events import runs


class PauseAt(L.Callback):
    """Stops every rank at the start of training batch ``batch`` of epoch ``epoch`` (writing
    ``{folder}/paused-r{rank}``), so that a test can SIGKILL the job at a known point."""

    def __init__(self, folder: str, epoch: int, batch: int) -> None:
        self.folder, self.epoch, self.batch = Path(folder), epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            (self.folder / f"paused-r{trainer.global_rank}").touch()
            time.sleep(600)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("resume"))
    model, tokenizer = load_backbone(str(root / "model"))
    make_label_folder(model, tokenizer, root / "train9", num=9, seed=2, shard_size=4)
    make_label_folder(model, tokenizer, root / "val3", num=3, seed=1, shard_size=2)
    return root


def resume_settings(root: Path, run: Path, streaming: bool) -> dict:
    """Two epochs of the 9-row folder, micro-batches of 1, two per optimiser step, validation after each
    epoch, a checkpoint after every step (each kept, by step)."""
    settings = fit_settings(root, run, max_steps=-1, accumulate=2, shuffle=True)
    settings["trainer"]["max_epochs"] = 2
    settings["trainer"]["callbacks"][0]["init_args"].update({"save_top_k": -1, "filename": "{step}"})
    settings["data"].update(
        {
            "train": str(root / "train9"),
            "val": str(root / "val3"),
            "streaming": streaming,
            "shuffle_buffer": 3,
        }
    )
    return settings


def write_config(run: Path, settings: dict, name: str = "fit.yaml") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    path = run / name
    path.write_text(yaml.safe_dump(settings))
    return path


def resume_config(root: Path, run: Path, streaming: bool) -> Path:
    """:func:`resume_settings` written to ``run/fit.yaml``."""
    return write_config(run, resume_settings(root, run, streaming))


def batches(records: list[dict]) -> list[tuple[int, list[str]]]:
    """``(global step after the batch, sample ids)`` of every recorded training batch."""
    return [(r["step"], r["ids"]) for r in records]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_fit_resumed_from_any_checkpoint_trains_what_an_uninterrupted_run_trains(
    workspace, tmp_path, streaming
):
    # 9 rows, one rank: 9 micro-batches per epoch, the 5th optimiser step spans the epoch boundary (Lightning
    # steps at the epoch's last batch: steps 1-4 and a 5th of one batch), 10 steps over two epochs
    whole = tmp_path / "whole"
    lkv_main(["fit", "--config", str(resume_config(workspace, whole, streaming))])
    reference = batches(read_losses(whole)[0])
    assert len(reference) == 18 and reference[-1][0] == 10
    # step 2: mid-epoch 0; step 5: after epoch 0's last batch; step 7: mid-epoch 1
    for step in (2, 5, 7):
        run = tmp_path / f"from{step}"
        config = resume_config(workspace, run, streaming)
        lkv_main(
            ["fit", "--config", str(config), "--ckpt_path", str(whole / "checkpoints" / f"step={step}.ckpt")]
        )
        # the uninterrupted run's batches after the one that made step `step`
        made = next(i for i, (after, _) in enumerate(reference) if after == step)
        assert batches(read_losses(run)[0]) == reference[made + 1 :], step
        assert trained_weights(run)[0] == 10


def test_a_resumed_fit_logs_into_the_tensorboard_run_it_resumes(workspace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default logger writes under ./runs
    run = tmp_path / "run"
    settings = resume_settings(workspace, run, streaming=False)
    del settings["trainer"]["logger"]  # `lkv fit`'s default: TensorBoard under ./runs
    settings["trainer"]["log_every_n_steps"] = 1
    config = write_config(run, settings)
    lkv_main(["fit", "--config", str(config), "--trainer.max_epochs=1", "--ckpt_path", "last"])
    lkv_main(["fit", "--config", str(config), "--ckpt_path", "last"])
    logged = runs(tmp_path / "runs")
    assert list(logged) == ["lightning_logs/version_0"]
    steps = [event.step for event in logged["lightning_logs/version_0"].Scalars("train/loss")]
    assert steps == list(range(10))  # the first fit's 5 steps (0-4), then the resumed fit's (5-9)


@pytest.mark.multiprocess
def test_a_two_rank_fit_killed_mid_epoch_resumes_with_the_batches_of_an_uninterrupted_run(
    workspace, tmp_path
):
    # Streamed: each rank reads its own 4 of the 9 rows and shuffles them through a 3-row buffer; 4
    # micro-batches per epoch and rank, 2 per step. The job is killed after step 3's checkpoint, in the middle
    # of the second epoch, then started again with the same command.
    strategy = ["--trainer.devices=2", "--trainer.strategy=ddp_find_unused_parameters_true"]
    run = tmp_path / "run"
    config = resume_config(workspace, run, streaming=True)
    settings = resume_settings(workspace, run, streaming=True)
    pause = {
        "class_path": "tests.cli.test_resume.PauseAt",
        "init_args": {"folder": str(run), "epoch": 1, "batch": 2},
    }
    settings["trainer"]["callbacks"].append(pause)
    paused_config = write_config(run, settings, "paused.yaml")
    command = ["fit", "--config", str(paused_config), *strategy, "--ckpt_path", "last"]
    with (tmp_path / "killed.log").open("w") as log:
        job = start_lkv(command, tmp_path, log)
    deadline = time.monotonic() + 240
    while not all((run / f"paused-r{rank}").exists() for rank in (0, 1)):
        assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[
            -3000:
        ]
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # every rank at once, as a pre-empted job
    job.wait()
    assert trained_weights(run)[0] == 3
    run_lkv(["fit", "--config", str(config), *strategy, "--ckpt_path", "last"], cwd=tmp_path)
    reference = tmp_path / "reference"
    run_lkv(
        ["fit", "--config", str(resume_config(workspace, reference, streaming=True)), *strategy], cwd=tmp_path
    )
    killed_and_resumed, whole = read_losses(run), read_losses(reference)
    assert sorted(whole) == [0, 1]
    for rank in (0, 1):
        assert batches(killed_and_resumed[rank]) == batches(whole[rank]), rank
        assert len(whole[rank]) == 8 and whole[rank][-1]["step"] == 4
    assert not {i for r in whole[0] for i in r["ids"]} & {i for r in whole[1] for i in r["ids"]}
