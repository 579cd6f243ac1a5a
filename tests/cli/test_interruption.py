"""Pre-emption: `lkv label` and `lkv fit` SIGKILLed mid-way, then started again with the same command.

The label rerun must finish the exact prompt set (no duplicates, no gaps, no partial shard read); the fit
rerun (``--ckpt_path last``, which also starts a first run) must resume at the last checkpoint's step and
end where an uninterrupted run ends, with the same weights.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lkv.cli import main as lkv_main
from lkv.labels.shards import shard_files
from lkv.train.cli import AtomicCheckpointIO
from lkv.train.datamodule import LabelDataModule
from tests.cli.conftest import (
    assert_labels_match_one_process,
    fit_config,
    label_args,
    make_workspace,
    read_losses,
    run_lkv,
    shard_ids,
    start_lkv,
    trained_weights,
    write_prompts,
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("scale"))


def kill_when(args: list[str], cwd: Path, ready: Callable[[], bool], timeout: float = 240) -> None:
    """Start ``lkv ARGS``, SIGKILL it as soon as ``ready()`` holds, and wait until it is gone."""
    log = cwd / "killed.log"
    with log.open("w") as out:
        process = start_lkv(args, cwd, out)
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(
                f"`lkv {args[0]}` ended or stalled before the kill point:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


@pytest.mark.multiprocess
def test_killed_label_run_reruns_to_the_exact_prompt_set(workspace, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 24)
    out = tmp_path / "labels"
    args = label_args(workspace, out, prompts, shard_size=2)
    kill_when(args, tmp_path, lambda: bool(shard_files(out)))
    done = shard_ids(out)  # reads every finished shard in full: a killed run leaves none truncated
    assert 0 < len(done) < 24 and len(done) == len(set(done)), done
    # A kill during a write leaves only its temporary file; one planted here must never be read as a shard.
    (out / ".labels-r000-00999.parquet.1.tmp").write_bytes(b"PAR1 cut short")
    output = run_lkv(args, cwd=tmp_path)
    assert f"24 prompts, {len(done)} already labelled, {24 - len(done)} to go" in output
    ids = shard_ids(out)
    assert sorted(ids) == sorted(f"q{i}" for i in range(24)) and len(ids) == len(set(ids))
    assert_labels_match_one_process(workspace, out, prompts)


@pytest.mark.multiprocess
def test_killed_fit_resumes_at_its_last_step_and_ends_like_an_uninterrupted_run(
    workspace, tmp_path, monkeypatch
):
    max_steps = 12  # 6 samples, batch 1: two shuffled epochs
    run, reference = tmp_path / "run", tmp_path / "reference"
    command = [
        "fit",
        "--config",
        str(fit_config(workspace, run, max_steps, shuffle=True)),
        "--ckpt_path",
        "last",
    ]
    kill_when(command, tmp_path, lambda: (run / "checkpoints" / "last.ckpt").exists())
    killed_step, _ = trained_weights(run)  # loads: the checkpoint write was atomic
    assert 0 < killed_step < max_steps
    before = len(read_losses(run)[0])
    run_lkv(command, cwd=tmp_path)  # the same command again
    resumed = read_losses(run)[0][before:]
    assert [r["step"] for r in resumed] == list(range(killed_step + 1, max_steps + 1))
    saved, atomic_save = [], AtomicCheckpointIO.save_checkpoint

    def spy(self, checkpoint, path, storage_options=None):
        saved.append(Path(path).name)
        atomic_save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", spy)
    lkv_main(["fit", "--config", str(fit_config(workspace, reference, max_steps, shuffle=True))])
    assert "last.ckpt" in saved  # `lkv fit` writes its checkpoints through AtomicCheckpointIO
    whole = read_losses(reference)[0]
    # The resumed run sees the samples the uninterrupted one saw at those steps (mid-epoch included).
    assert [r["ids"] for r in resumed] == [r["ids"] for r in whole[killed_step:]]
    step, weights = trained_weights(run)
    want_step, want = trained_weights(reference)
    assert step == want_step == max_steps
    for name, weight in want.items():
        torch.testing.assert_close(weights[name], weight, atol=1e-6, rtol=1e-5, msg=name)


def test_a_checkpoint_write_cut_short_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, path)
    before = path.read_bytes()

    def killed_mid_write(obj, file):
        Path(file).write_bytes(before[: len(before) // 2])  # part of the new checkpoint reached the disk
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, path)
    assert path.read_bytes() == before
    # only the hidden temporary file holds the cut-short write; readers look for `last.ckpt`
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        ["last.ckpt", f".last.ckpt.{os.getpid()}.tmp"]
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("streaming", [False, True])
def test_training_loader_resumes_at_any_batch_of_any_epoch(workspace, streaming, workers, no_stream_sleep):
    def loader(state: dict | None = None) -> tuple[LabelDataModule, StatefulDataLoader]:
        data = LabelDataModule(
            train=str(workspace / "train"), streaming=streaming, seed=1, shuffle_buffer=4, num_workers=workers
        )
        data.setup("fit")
        dl = data.train_dataloader()
        if state is not None:
            dl.load_state_dict(state)
        return data, dl

    def set_epoch(data: LabelDataModule, dl: StatefulDataLoader, number: int) -> None:
        data.set_epoch(number)  # what Lightning does for the sampler / the module for a stream
        if hasattr(dl.sampler, "set_epoch"):
            dl.sampler.set_epoch(number)

    def epoch(dl: StatefulDataLoader) -> list[str]:
        return [sample["id"] for batch in dl for sample in batch]

    data, dl = loader()
    whole = []
    for number in range(3):
        set_epoch(data, dl, number)
        whole.append(epoch(dl))
    assert len(set(map(tuple, whole))) == 3  # reshuffled every epoch
    # 2 of epoch 1's 6 batches; all 6 (the state then names epoch 2)
    for taken in (2, 6):
        data, killed = loader()
        set_epoch(data, killed, 1)
        batches = iter(killed)
        first = [sample["id"] for _ in range(taken) for sample in next(batches)]
        assert first == whole[1][:taken]
        data, dl = loader(killed.state_dict())  # what a checkpoint holds; the state sets the epoch
        rest = epoch(dl)
        assert rest == (whole[1][taken:] if taken < 6 else whole[2]), taken
        set_epoch(data, dl, 2)
        assert taken == 6 or epoch(dl) == whole[2]
    with pytest.raises(ValueError, match="training loader state: expected a non-negative integer 'epoch'"):
        dl.load_state_dict({"epoch": -1, "loader": {}})
