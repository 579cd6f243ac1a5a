"""Table and plot of the data-scaling study, with 95 % intervals, from the sweep's per-point eval rows.

    python experiments/data_scaling/summarize.py [--config configs/sweeps/data_scaling_smollm2.yaml]
        [--sweep runs/data_scaling/sweep] [--out experiments/data_scaling]

For every finished point (``points/<point>/result.json``) it reads ``points/<point>/eval/results.jsonl`` and
reports, per number of training prompts N:

- held-out Recall@C of LookaheadKV (mean over the held-out labels, percentile-bootstrap interval);
- out-of-distribution needle retention at each budget C: of the samples FullKV solves, the share LookaheadKV
  also solves (``k / n``, Wilson interval; ``n`` = FullKV-solved samples, the same for every point), and the
  plain LookaheadKV and FullKV accuracies beside it.

Writes ``summary.csv``, ``summary.md`` and ``scaling.png`` into ``--out``. Points not finished yet are listed
as missing, so a partial study is labelled as such.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from lkv.eval.stats import bootstrap_interval, wilson_interval
from lkv.train.grid import grid_points, point_name

ROOT = Path(__file__).resolve().parents[2]
SWEEP_CONFIG = ROOT / "configs/sweeps/data_scaling_smollm2.yaml"
SIZE_KEY = "data.limit_train_samples"
RECALL_BUDGETS = (64, 128, 256)


def point_rows(folder: Path) -> list[dict[str, Any]]:
    """The eval result rows of one point (``[]`` when its eval has not run)."""
    path = folder / "eval" / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def summarize_point(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Recall@C and needle retention of one point, each with ``n`` and a 95 % interval."""
    out: dict[str, Any] = {}
    importance = [r for r in rows if r["task"] == "importance" and r["method"] == "lookaheadkv"]
    for c in RECALL_BUDGETS:
        values = [r["metrics"][f"recall@{c}"] for r in importance if f"recall@{c}" in r["metrics"]]
        if values:
            low, high = bootstrap_interval(values)
            out[f"recall@{c}"] = (sum(values) / len(values), low, high, len(values))
    needles = [r for r in rows if r["task"] == "needle_ood" and r["setting"] == "aware"]
    full = {r["sample"]: r["score"] for r in needles if r["method"] == "fullkv"}
    by_budget: dict[str, dict[str, float]] = defaultdict(dict)
    for r in needles:
        if r["method"] == "lookaheadkv":
            by_budget[r["budget"]][r["sample"]] = r["score"]
    if full:
        solved = sum(v == 1.0 for v in full.values())
        out["fullkv_solved"] = (solved, len(full))
    for budget, scores in sorted(by_budget.items(), key=lambda kv: int(kv[0])):
        shared = [s for s in scores if s in full]
        solved_by_full = [s for s in shared if full[s] == 1.0]
        kept = sum(scores[s] == 1.0 for s in solved_by_full)
        if solved_by_full:
            n = len(solved_by_full)
            out[f"retention@{budget}"] = (kept / n, *wilson_interval(kept, n), n)
        hits = sum(scores[s] == 1.0 for s in shared)
        out[f"lkv_solved@{budget}"] = (hits, len(shared))
    return out


def _cell(entry: tuple | None, percent: bool = True) -> str:
    if entry is None:
        return ""
    value, low, high, n = entry
    scale = 100 if percent else 1
    digits = 1 if percent else 3
    return f"{scale * value:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}] (n={n})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(SWEEP_CONFIG), help="the sweep config (its grid)")
    parser.add_argument(
        "--sweep", default=str(ROOT / "runs/data_scaling/sweep"), help="the sweep's output folder"
    )
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="where the summary goes")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    sweep, out = Path(args.sweep), Path(args.out)
    done, missing = [], []
    for values in grid_points(config["grid"]):
        folder = sweep / "points" / point_name(values)
        result = folder / "result.json"
        if not result.exists():
            missing.append(values[SIZE_KEY])
            continue
        info = json.loads(result.read_text())
        done.append((values[SIZE_KEY], info["fit_s"], summarize_point(point_rows(folder))))
    budgets = sorted({k.split("@")[1] for _, _, s in done for k in s if k.startswith("retention@")}, key=int)

    columns = ["prompts", "fit_s", *[f"recall@{c}" for c in RECALL_BUDGETS]]
    columns += [f"retention@{b}" for b in budgets]
    with (out / "summary.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        header = ["prompts", "fit_s", "fullkv_solved", "fullkv_n"]
        for name in columns[2:]:
            header += [name, f"{name}_low", f"{name}_high", f"{name}_n"]
        writer.writerow(header)
        for n, fit_s, s in done:
            row: list[Any] = [n, f"{fit_s:.0f}", *s.get("fullkv_solved", ("", ""))]
            for name in columns[2:]:
                row += [f"{v:.4f}" if isinstance(v, float) else v for v in s.get(name, ("", "", "", ""))]
            writer.writerow(row)

    status = "complete" if not missing else f"PARTIAL: points N = {missing} not finished"
    lines = [f"# Data scaling: held-out Recall@C and OOD needle retention vs training prompts ({status})", ""]
    lines += ["Mean [95 % interval] (n). Recall: LookaheadKV on the held-out labels, bootstrap interval. "]
    lines += [
        "Retention@C: FullKV-solved out-of-distribution needles that LookaheadKV also solves, Wilson.",
        "",
    ]
    lines += ["| N prompts | fit (min) | FullKV solved | " + " | ".join(columns[2:]) + " |"]
    lines += ["|" + "---|" * (len(columns) + 1)]
    for n, fit_s, s in done:
        full = s.get("fullkv_solved")
        cells = [_cell(s.get(name), percent=name.startswith("retention")) for name in columns[2:]]
        full_cell = f"{full[0]}/{full[1]}" if full else ""
        lines.append(f"| {n} | {fit_s / 60:.0f} | {full_cell} | " + " | ".join(cells) + " |")
    lines += ["", "![scaling](scaling.png)"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")

    fig = Figure(figsize=(10, 4), layout="constrained")
    recall_ax, retention_ax = fig.subplots(1, 2)
    for ax, names, scale in (
        (recall_ax, [f"recall@{c}" for c in RECALL_BUDGETS], 1),
        (retention_ax, [f"retention@{b}" for b in budgets], 100),
    ):
        for name in names:
            points = [(n, s[name]) for n, _, s in done if name in s]
            if not points:
                continue
            xs = [n for n, _ in points]
            ys = [scale * e[0] for _, e in points]
            errors = [[scale * (e[0] - e[1]) for _, e in points], [scale * (e[2] - e[0]) for _, e in points]]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        sizes = config["grid"][SIZE_KEY]
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel(f"training prompts (fixed {config['overrides']['trainer.max_steps']} steps)")
        ax.grid(alpha=0.3)
        ax.legend()
    recall_ax.set_ylabel("held-out Recall@C (LookaheadKV)")
    retention_ax.set_ylabel("OOD needles: % of FullKV-solved kept")
    title = "data scaling, SmolLM2-135M" + ("" if not missing else f" — partial, N = {missing} missing")
    fig.suptitle(title)
    fig.savefig(out / "scaling.png", dpi=110)
    print(f"{len(done)} points done, missing {missing}; wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
