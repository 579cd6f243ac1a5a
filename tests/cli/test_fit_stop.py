"""A fit stopped by SIGTERM (a scheduler's pre-emption) or Ctrl-C ends with a non-zero status and one line
saying what was kept and the command that resumes; that command then finishes the fit."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import lightning as L
import pytest

from tests.cli.conftest import fit_settings, make_workspace, run_lkv, start_lkv, trained_weights
from tests.cli.test_resume import write_config


class WaitForSignal(L.Callback):
    """At the start of training batch ``batch``, writes ``{folder}/waiting`` and waits (up to 120 s) until the
    process has been told to stop: Lightning's SIGTERM flag, or the KeyboardInterrupt of SIGINT."""

    def __init__(self, folder: str, batch: int) -> None:
        self.folder, self.batch = Path(folder), batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx != self.batch:
            return
        (self.folder / "waiting").touch()
        deadline = time.monotonic() + 120
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("stop"))


@pytest.mark.parametrize(
    ("sent", "status", "how", "kept"),
    [(signal.SIGTERM, 143, "SIGTERM", 3), (signal.SIGINT, 130, "Ctrl-C", 2)],
)
def test_a_stopped_fit_says_what_it_kept_and_resumes(workspace, tmp_path, sent, status, how, kept):
    run = tmp_path / "run"
    settings = fit_settings(workspace, run, max_steps=4)
    plain = write_config(run, settings)
    settings["trainer"]["callbacks"].append(
        {"class_path": "tests.cli.test_fit_stop.WaitForSignal", "init_args": {"folder": str(run), "batch": 2}}
    )
    config = write_config(run, settings, "waiting.yaml")
    args = ["fit", "--config", str(config)]
    job = start_lkv(args, cwd=tmp_path)
    deadline = time.monotonic() + 240
    while not (run / "waiting").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0][-3000:]
        time.sleep(0.05)
    job.send_signal(sent)
    output, _ = job.communicate(timeout=120)
    assert job.returncode == status, output[-3000:]
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1] == (
        f"lkv fit: stopped by {how}; the checkpoints so far are kept; resume from the last one: "
        f"lkv fit --config {config} --ckpt_path last"
    )
    # SIGTERM lets the batch in flight (the third) finish and be checkpointed; Ctrl-C stops inside it
    assert trained_weights(run)[0] == kept
    run_lkv(["fit", "--config", str(plain), "--ckpt_path", "last"], cwd=tmp_path)
    assert trained_weights(run)[0] == 4
