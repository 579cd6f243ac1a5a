"""`lkv sweep` through submitit: a job array on submitit's local executor gives the local mode's summary;
the SLURM parameters of the `launcher:` section reach the sbatch script (a fake `sbatch`/`srun`/`sacct` on
the PATH, no cluster); `--summarize` refuses a grid with missing points, naming each point's job and log."""

import csv
import json
import os
import pickle
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from submitit.core.utils import JobPaths

from lkv.cli import main as lkv_main
from lkv.sweep.launch import Launcher, job_devices, parse_launcher

# Columns that measure wall time (of the fit and of the lookahead-vs-prefill timing): they differ between any
# two runs. Every other column — the grid values and every metric — must match.
WALL_TIME_COLUMNS = {"fit_s", "overhead", "lookahead_ms", "prefill_ms"}
FAKE_JOB = "4242"
ROOT = Path(__file__).resolve().parents[2]


def sweep_config(tiny_setup: dict[str, Path], folder: Path, **extra) -> Path:
    """A 2-point sweep of the tiny model (+ timing + eval) writing into ``folder``; returns its YAML."""
    config = {
        "base": str(tiny_setup["fit"]),
        "output": str(folder / "sweep"),
        "eval_config": str(tiny_setup["eval"]),
        "grid": {"model.num_lookahead": [2, 4]},
        "score": "val/recall@4",
        "overhead_tokens": 16,
        "overhead_repeats": 1,
        **extra,
    }
    path = folder / "sweep.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def summary_table(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The columns and rows of a summary.csv without its wall-time columns."""
    with path.open(encoding="utf-8") as rows:
        reader = csv.DictReader(rows)
        table = [{k: v for k, v in row.items() if k not in WALL_TIME_COLUMNS} for row in reader]
        return [c for c in reader.fieldnames or [] if c not in WALL_TIME_COLUMNS], table


def test_local_executor_job_array_gives_the_local_summary(tiny_setup, tmp_path, capsys):
    lkv_main(["sweep", "--config", str(sweep_config(tiny_setup, tmp_path / "here"))])
    assert "2 run now" in capsys.readouterr().out
    launcher = {"executor": "local", "timeout_min": 20, "wait": True}
    launched = sweep_config(tiny_setup, tmp_path / "jobs", launcher=launcher)
    lkv_main(["sweep", "--config", str(launched)])
    said = capsys.readouterr().out
    assert "2 submitted to local" in said and "0 already done" in said and "all ended" in said

    columns, rows = summary_table(tmp_path / "jobs" / "sweep" / "summary.csv")
    assert (columns, rows) == summary_table(tmp_path / "here" / "sweep" / "summary.csv")
    assert {"model.num_lookahead", "val/recall@4", "val/kl", "eval/importance/recall@4"} <= set(columns)
    assert [row["model.num_lookahead"] for row in rows] == ["2", "4"]
    out = tmp_path / "jobs" / "sweep"
    for point in ("num_lookahead=2", "num_lookahead=4"):
        record = json.loads((out / "points" / point / "job.json").read_text())
        assert record["executor"] == "local" and Path(record["stderr"]).is_file()
        assert Path(record["folder"]) == out / "jobs"
        assert (out / "points" / point / "checkpoints" / "last.ckpt").is_file()

    # resumable: a finished point is not submitted again
    lkv_main(["sweep", "--config", str(launched)])
    said = capsys.readouterr().out
    assert "0 submitted to local" in said and "2 already done" in said


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """`srun`, `sbatch` (answers job 4242) and `sacct` (both array jobs running) first on the PATH."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    scripts = {
        "srun": "exit 1",
        "sbatch": f'echo "Submitted batch job {FAKE_JOB}"',
        "sacct": f'printf "JobID|State|NodeList\\n{FAKE_JOB}_0|RUNNING|n1\\n{FAKE_JOB}_1|PENDING|None\\n"',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_slurm_parameters_reach_the_sbatch_script_and_summarize_names_the_missing_jobs(
    tiny_setup, tmp_path, fake_slurm, capsys
):
    launcher = {
        "executor": "slurm",
        "nodes": 1,
        "gpus_per_node": 2,
        "cpus_per_task": 6,
        "mem_gb": 64,
        "timeout_min": 240,
        "partition": "gpu",
        "array_parallelism": 1,
        "slurm_args": {"account": "lkv", "qos": "high"},
        "setup": ["source .venv/bin/activate"],
        "name": "lkv-test",
    }
    # the points train on 2 GPUs, one DDP rank per SLURM task
    config = sweep_config(tiny_setup, tmp_path, launcher=launcher, overrides={"trainer.devices": 2})
    lkv_main(["sweep", "--config", str(config)])
    assert f"2 submitted to slurm (jobs {FAKE_JOB}_0 … {FAKE_JOB}_1" in capsys.readouterr().out
    out = tmp_path / "sweep"
    script = (out / "jobs" / f"{FAKE_JOB}_submission.sh").read_text()
    flags = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {
        "#SBATCH --nodes=1",
        "#SBATCH --gpus-per-node=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --cpus-per-task=6",
        "#SBATCH --mem=64GB",
        "#SBATCH --time=240",
        "#SBATCH --partition=gpu",
        "#SBATCH --array=0-1%1",
        "#SBATCH --account=lkv",
        "#SBATCH --qos=high",
        "#SBATCH --job-name=lkv-test",
    } <= flags, flags
    assert "source .venv/bin/activate" in script and "srun" in script and "submitit.core._submit" in script
    records = [
        json.loads((out / "points" / p / "job.json").read_text())
        for p in ("num_lookahead=2", "num_lookahead=4")
    ]
    assert [r["job_id"] for r in records] == [f"{FAKE_JOB}_0", f"{FAKE_JOB}_1"]

    # sacct says both still run: a rerun submits neither again
    lkv_main(["sweep", "--config", str(config)])
    said = capsys.readouterr().out
    assert "0 submitted" in said and f"2 still queued or running: num_lookahead=2 (job {FAKE_JOB}_0)" in said

    # no result yet: --summarize names each point, its job and its log; point 4's job failed (submitit
    # pickles the traceback, here of run_point's error, whose message ends with the fit log's tail)
    crash = "sweep point num_lookahead=4: `lkv fit` exited with 1; log tail:"
    trace = f"Traceback (most recent call last):\n  File x\nRuntimeError: {crash}\nCUDA out of memory."
    failed = JobPaths(out / "jobs", job_id=f"{FAKE_JOB}_1", task_id=0)
    failed.result_pickle.write_bytes(pickle.dumps(("error", trace)))
    with pytest.raises(SystemExit):
        lkv_main(["sweep", "--config", str(config), "--summarize", "true"])
    error = capsys.readouterr().err
    assert "2 of 2 points have no result.json" in error
    assert f"num_lookahead=2: job {FAKE_JOB}_0 has not ended" in error and records[0]["stderr"] in error
    assert f"num_lookahead=4: job {FAKE_JOB}_1 failed (RuntimeError: {crash}); log: {failed.stderr}" in error
    assert not (out / "summary.csv").exists()

    # one point finished: refused without --allow_partial, summarised with it (the other still listed)
    finished = {"point": "num_lookahead=2", "values": {"model.num_lookahead": 2}, "fit_s": 1.0}
    (out / "points" / "num_lookahead=2" / "result.json").write_text(
        json.dumps({**finished, "metrics": {"val/recall@4": 0.5}})
    )
    with pytest.raises(SystemExit):
        lkv_main(["sweep", "--config", str(config), "--summarize", "true"])
    assert "1 of 2 points have no result.json" in capsys.readouterr().err
    lkv_main(["sweep", "--config", str(config), "--summarize", "true", "--allow_partial", "true"])
    said = capsys.readouterr().out
    assert "summarised 1 of 2 points" in said and "num_lookahead=4: job" in said
    assert [row["model.num_lookahead"] for row in summary_table(out / "summary.csv")[1]] == ["2"]


@pytest.mark.parametrize(
    ("launcher", "message"),
    [
        ({"gpus_pernode": 8}, "launcher.gpus_pernode: unknown key; expected one of executor, nodes"),
        ({"nodes": "two"}, "launcher.nodes: expected a positive integer, found 'two'"),
        ({"executor": "pbs"}, "launcher.executor: expected one of slurm, local, found 'pbs'"),
        ({"timeout_min": 0}, "launcher.timeout_min: expected a positive integer, found 0"),
        ({"slurm_args": ["--account=x"]}, "launcher.slurm_args: expected a mapping of sbatch flag"),
        ({"executor": "local", "gpus_per_node": 2}, "launcher.executor: local runs one task on this machine"),
        # the tiny fit config runs on the CPU with trainer.devices: auto, i.e. one process per node
        (
            {"gpus_per_node": 8},
            "launcher.tasks_per_node: 8 tasks per node, but point num_lookahead=2 has "
            "trainer.devices: auto (1 per node in this job",
        ),
        ({"nodes": 2}, "launcher.nodes: 2, but point num_lookahead=2 has trainer.num_nodes: 1"),
    ],
)
def test_bad_launcher_settings_name_the_yaml_field(
    tiny_setup, tmp_path, fake_slurm, capsys, launcher, message
):
    config = sweep_config(tiny_setup, tmp_path, launcher=launcher)
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["sweep", "--config", str(config)])
    assert exit_info.value.code == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "jobs").exists()  # nothing was submitted


def test_job_devices_resolves_what_lightning_would_use_in_the_job():
    job = Launcher(gpus_per_node=4)
    assert job_devices({"accelerator": "gpu", "devices": "auto"}, job) == 4
    assert job_devices({"devices": -1}, job) == 4
    assert job_devices({"accelerator": "cpu", "devices": "auto"}, job) == 1
    assert job_devices({"devices": "auto"}, Launcher()) == 1
    assert job_devices({"devices": [0, 1]}, job) == 2 and job_devices({"devices": "0,1,2"}, job) == 3
    assert job_devices({"devices": "8"}, job) == 8 and job_devices({"devices": 2}, job) == 2


def test_launcher_defaults_one_task_per_gpu():
    assert parse_launcher({"gpus_per_node": 8}).tasks == 8
    assert parse_launcher({}) == Launcher() and Launcher().tasks == 1
    assert parse_launcher({"gpus_per_node": 8, "tasks_per_node": 1}).tasks == 1


@pytest.mark.multiprocess
def test_a_two_task_job_is_one_ddp_fit_and_task_0_writes_the_result(tiny_setup, tmp_path):
    """What `srun` does in a job of 2 tasks, without SLURM: two processes with the variables srun gives
    its tasks each run the job's function; their `lkv fit` children must form one DDP group through
    Lightning's SLURMEnvironment (not two separate fits), and only task 0 may write the result."""
    base = yaml.safe_load(tiny_setup["fit"].read_text())
    base["trainer"].update(devices=2, strategy="ddp")
    out = tmp_path / "sweep"
    args = tmp_path / "args.pkl"
    args.write_bytes(pickle.dumps(({"model.num_lookahead": 2}, base, out, None, 0, 1, None)))
    call = "import pickle, sys; from lkv.sweep.launch import point_job; "
    call += "print('returned', point_job(*pickle.load(open(sys.argv[1], 'rb'))) is None)"
    with socket.socket() as probe:  # a free port for the ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": FAKE_JOB,
        "SLURM_JOB_NAME": "lkv-sweep",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
        "SLURM_JOB_NODELIST": "localhost",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    tasks = [
        subprocess.Popen(
            [sys.executable, "-c", call, str(args)],
            env={**os.environ, **job, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    said = [task.communicate(timeout=600)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], said
    assert ["returned False" in said[0], "returned True" in said[1]] == [True, True], said
    point = out / "points" / "num_lookahead=2"
    # each rank's fit logged its place in the one 2-process group
    assert "MEMBER: 1/2" in (point / "fit.log").read_text()
    assert "MEMBER: 2/2" in (point / "fit.rank1.log").read_text()
    result = json.loads((point / "result.json").read_text())
    assert result["point"] == "num_lookahead=2" and 0 <= result["metrics"]["val/recall@4"] <= 1
