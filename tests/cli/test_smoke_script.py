"""scripts/smoke_gpu.sh in its CPU dry run: the paper recipe's commands chained with no manual step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["label-train", "label-heldout", "fit", "fit-resume", "eval", "bench-ttft"]


@pytest.mark.slow
def test_smoke_dry_run_labels_fits_resumes_evaluates_and_benches(tmp_path):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    subprocess.run(["bash", "scripts/smoke_gpu.sh"], cwd=ROOT, env=env, check=True, timeout=900)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == STAGES
    assert all(s["seconds"] > 0 and s["peak_bytes"] > 0 for s in summary["stages"])
    # the first run stops at step 4, the resumed one continues from last.ckpt to step 6
    assert [len(run) for run in summary["step_seconds"]] == [4, 2]
    assert summary["median_s_per_step"] > 0
    assert {p.name for p in (tmp_path / "checkpoints").glob("*step=*.ckpt")} >= {
        "epoch=0-step=2.ckpt",
        "epoch=1-step=4.ckpt",
        "epoch=1-step=6.ckpt",
    }
    for methods in summary["ttft"].values():
        assert set(methods) == {"snapkv", "lookaheadkv", "laq", "speckv"}
    meta = json.loads((tmp_path / "labels" / "train" / "meta.json").read_text())
    assert meta["store_scores"] is False
    assert json.loads((tmp_path / "labels" / "heldout" / "meta.json").read_text())["store_scores"] is True
    rows = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"lookaheadkv", "snapkv"}
    events = EventAccumulator(str(next((tmp_path / "runs").rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert "val/kl" in events.Tags()["scalars"]
