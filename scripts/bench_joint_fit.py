"""What one joint fit saves: a lookahead module fit + a probe fit (two runs) vs one fit training both.

From one joint fit config (``model.probe`` set, e.g. configs/long_smollm2.yaml) it writes three `lkv fit`
configs over the same labels and the same number of optimiser steps, training only (no validation, no
checkpoint, no logger, none of the config's callbacks):

- ``module``: the config with ``model.probe: null`` (the lookahead module alone);
- ``probe``: :class:`lkv.train.probe_module.ProbeModule` with the config's probe settings (the probe alone);
- ``joint``: the config as it is.

Each runs as its own ``lkv fit`` process, one after the other, ``--rounds`` times in alternating order (module,
probe, joint, then joint, probe, module, ...) so that a machine shared with other jobs loads them alike. Per run:
wall seconds of the whole process (start-up and model load included: each of the two runs pays for them) and its
peak resident memory (``ru_maxrss`` of that child, from ``os.wait4``). The row ``two runs`` is module + probe
(wall: their sum, memory: the larger peak, as they run one after the other). Writes ``runs.jsonl`` (every run)
and ``summary.md`` (medians over rounds, and the ratio joint / two runs) to ``--output``.

    OMP_NUM_THREADS=1 python scripts/bench_joint_fit.py --config configs/long_smollm2.yaml \\
        --train data/labels/joint_bench/train --steps 12 --rounds 2 --output experiments/joint_fit
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

KINDS = ("module", "probe", "joint")
# the LightningModule arguments a probe-only fit shares with the joint fit's module section
SHARED = ("model", "dtype", "attn_implementation", "eval_budgets", "snapkv_window", "snapkv_kernel")


def run_configs(joint: dict[str, Any], train: str, steps: int, root: Path) -> dict[str, dict[str, Any]]:
    """The three fit configs (``module``, ``probe``, ``joint``) of the joint config ``joint``, writing what a
    fit writes (its ``config.yaml``) under ``root``."""
    model = joint.get("model") or {}
    if not isinstance(model.get("probe"), dict):
        raise ValueError("model.probe: expected the probe settings of a joint fit, found none")
    base = copy.deepcopy(joint)
    base.pop("config", None)
    trainer = base.setdefault("trainer", {})
    trainer.update(
        {
            "max_steps": steps,
            "max_epochs": -1,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "enable_checkpointing": False,
            "logger": False,
            "callbacks": [],
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(root),
        }
    )
    base["data"] = {**base.get("data", {}), "train": train, "val": None}
    probe = dict(model["probe"])
    probe.pop("preset", None)
    configs = {"joint": base, "module": copy.deepcopy(base)}
    configs["module"]["model"]["probe"] = None
    configs["probe"] = copy.deepcopy(base)
    configs["probe"]["model"] = {
        "class_path": "lkv.train.probe_module.ProbeModule",
        "init_args": {**{k: model[k] for k in SHARED if k in model}, **probe},
    }
    return configs


def run_fit(config: Path) -> dict[str, float]:
    """``lkv fit --config config`` in its own process: wall seconds, CPU seconds (user + system: what the run
    itself computed, less sensitive than wall time to other jobs on a shared machine) and peak resident MiB."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "lkv", "fit", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"lkv fit --config {config} failed:\n{process.stderr.read().decode()[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def summary(runs: list[dict[str, Any]], steps: int, train: str, command: str) -> str:
    """Markdown: per kind the median wall time, CPU time and peak memory over rounds, ``two runs`` (module +
    probe), and joint / two runs: of the medians, and the median of each round's own ratio (the runs of one
    round ran minutes apart, under much the same load)."""
    keys = ("wall_s", "cpu_s", "peak_rss_mib")
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["kind"]): r for r in runs}

    def two_runs(rows: dict[str, dict[str, float]]) -> dict[str, float]:
        module, probe = rows["module"], rows["probe"]
        return {
            "wall_s": module["wall_s"] + probe["wall_s"],
            "cpu_s": module["cpu_s"] + probe["cpu_s"],
            "peak_rss_mib": max(module["peak_rss_mib"], probe["peak_rss_mib"]),
        }

    median = {kind: {k: statistics.median(by[i, kind][k] for i in rounds) for k in keys} for kind in KINDS}
    median["two runs (module + probe)"] = two_runs(median)
    per_round = [
        {k: by[i, "joint"][k] / two_runs({kind: by[i, kind] for kind in KINDS})[k] for k in keys}
        for i in rounds
    ]
    ratio = {k: median["joint"][k] / median["two runs (module + probe)"][k] for k in keys}
    round_ratio = {k: statistics.median(r[k] for r in per_round) for k in keys}
    lines = [
        f"`{command}`",
        "",
        f"{steps} optimiser steps of batch 1 on {train}, training only; medians of {len(rounds)} rounds; load "
        f"average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| run | wall s | CPU s | peak RSS MiB |",
        "|---|---:|---:|---:|",
        *(
            f"| {kind} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | {row['peak_rss_mib']:.0f} |"
            for kind, row in median.items()
        ),
        "",
        "| joint / two runs | wall | CPU | peak memory |",
        "|---|---:|---:|---:|",
        f"| of the medians | {ratio['wall_s']:.2f}x | {ratio['cpu_s']:.2f}x | {ratio['peak_rss_mib']:.2f}x |",
        f"| median of the rounds' own | {round_ratio['wall_s']:.2f}x | {round_ratio['cpu_s']:.2f}x | "
        f"{round_ratio['peak_rss_mib']:.2f}x |",
        "",
        "per round (wall, CPU): " + ", ".join(f"{r['wall_s']:.2f}x / {r['cpu_s']:.2f}x" for r in per_round),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a joint fit config (model.probe set)")
    parser.add_argument("--train", required=True, help="label folder(s) of the three fits, comma-separated")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    command = "OMP_NUM_THREADS=1 python scripts/bench_joint_fit.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    train = args.train.split(",")
    joint = yaml.safe_load(Path(args.config).read_text())
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        configs = run_configs(joint, train if len(train) > 1 else train[0], args.steps, Path(tmp))
        for name, config in configs.items():
            (Path(tmp) / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        for index in range(args.rounds):
            for kind in KINDS if index % 2 == 0 else reversed(KINDS):
                row = {
                    "round": index,
                    "kind": kind,
                    "steps": args.steps,
                    **run_fit(Path(tmp) / f"{kind}.yaml"),
                }
                print(json.dumps(row), flush=True)
                runs.append(row)
    (output / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    text = summary(runs, args.steps, args.train, command)
    (output / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
