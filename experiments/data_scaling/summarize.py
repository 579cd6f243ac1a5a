"""Table and plot of the data-scaling study, with 95 % intervals, from the sweep's per-point eval rows.

    python experiments/data_scaling/summarize.py [--config configs/sweeps/data_scaling_smollm2.yaml]
        [--sweep runs/data_scaling/sweep] [--baselines runs/data_scaling/baselines]
        [--out experiments/data_scaling]

For every finished point (``points/<point>/result.json``) it reads ``points/<point>/eval/results.jsonl`` and
reports, per number of training prompts N:

- held-out Recall@C of LookaheadKV (mean over the held-out labels, percentile-bootstrap interval);
- out-of-distribution needle retention at each budget C: of the samples FullKV solves, the share LookaheadKV
  also solves (``k / n``, Wilson interval; ``n`` = FullKV-solved samples, the same for every point).

The training-free references come from one ``lkv eval`` of the same eval config without an adapter
(``--baselines``, e.g. ``--methods '[fullkv, snapkv, pyramidkv]'``): the same held-out labels and needle
samples, so every point is compared with them *paired* — exact McNemar on the FullKV-solved needles, paired
bootstrap on the held-out recall — and so is the largest N with the smallest.

Writes ``summary.csv``, ``summary.md`` and ``scaling.png`` into ``--out``. Points not finished yet are listed
as missing, so a partial study is labelled as such.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from itertools import cycle
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure

from lkv.eval.paired import pair_by_sample
from lkv.eval.results import FULL
from lkv.eval.stats import PairedResult, bootstrap_interval, wilson_interval
from lkv.sweep.grid import grid_points, point_name

ROOT = Path(__file__).resolve().parents[2]
SWEEP_CONFIG = ROOT / "configs/sweeps/data_scaling_smollm2.yaml"
SIZE_KEY = "data.limit_train_samples"
RECALL_BUDGETS = (64, 128, 256)
METHOD = "lookaheadkv"

Scores = dict[str, dict[str, float]]  # metric (recall@C, retention@C) → {sample id: score}
Entry = tuple[float, float, float, int]  # mean, 95 % low, 95 % high, n


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """The result rows of an ``lkv eval`` folder (``[]`` when it has not run)."""
    path = folder / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def method_scores(rows: list[dict[str, Any]], method: str, solved: set[str]) -> Scores:
    """``method``'s per-sample scores: ``recall@C`` on every held-out label and ``retention@C`` (0/1) on the
    ``solved`` out-of-distribution needles (question-aware)."""
    scores: Scores = defaultdict(dict)
    for r in rows:
        if r["method"] != method:
            continue
        if r["task"] == "importance":
            for c in RECALL_BUDGETS:
                if f"recall@{c}" in r["metrics"]:
                    scores[f"recall@{c}"][r["sample"]] = r["metrics"][f"recall@{c}"]
        elif r["task"] == "needle_ood" and r["setting"] == "aware" and r["sample"] in solved:
            scores[f"retention@{r['budget']}"][r["sample"]] = r["score"]
    return dict(scores)


def fullkv_solved(rows: list[dict[str, Any]]) -> tuple[set[str], int]:
    """The out-of-distribution needles FullKV solves (question-aware), and how many it answered."""
    full = {
        r["sample"]: r["score"]
        for r in rows
        if r["method"] == "fullkv"
        and r["task"] == "needle_ood"
        and r["setting"] == "aware"
        and r["budget"] == FULL
    }
    return {s for s, v in full.items() if v == 1.0}, len(full)


def summarize(scores: Scores) -> dict[str, Entry]:
    """Each metric's mean with its 95 % interval and n: Wilson for retention, bootstrap for recall."""
    out: dict[str, Entry] = {}
    for name, values in scores.items():
        n = len(values)
        mean = sum(values.values()) / n
        if name.startswith("retention@"):
            out[name] = (mean, *wilson_interval(round(mean * n), n), n)
        else:
            out[name] = (mean, *bootstrap_interval(list(values.values())), n)
    return out


def compare(mine: Scores, other: Scores) -> dict[str, PairedResult]:
    """Per shared metric, ``mine`` vs ``other`` on their common samples (McNemar for the 0/1 retention,
    paired bootstrap for recall)."""
    results = {name: pair_by_sample(mine[name], other[name]) for name in sorted(set(mine) & set(other))}
    return {name: result for name, result in results.items() if result is not None}


def _cell(entry: Entry | None, percent: bool) -> str:
    if entry is None:
        return ""
    value, low, high, n = entry
    scale, digits = (100, 1) if percent else (1, 3)
    return f"{scale * value:.{digits}f} [{scale * low:.{digits}f}, {scale * high:.{digits}f}] (n={n})"


def _paired_cell(result: PairedResult | None, percent: bool) -> str:
    if result is None:
        return ""
    scale, digits = (100, 1) if percent else (1, 3)
    mark = "**" if result.significant else ""
    return f"{mark}{scale * result.diff:+.{digits}f}{mark} ({result.wins}/{result.losses}, p={result.p:.3g})"


def write_csv(path: Path, table: list[tuple[str, str, dict[str, Entry]]], names: list[str]) -> None:
    """One row per grid point (LookaheadKV at N prompts) or training-free method, every metric with its
    interval and n."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        header = ["prompts", "method", "fit_s"]
        for name in names:
            header += [name, f"{name}_low", f"{name}_high", f"{name}_n"]
        writer.writerow(header)
        for label, fit_s, entries in table:
            row: list[Any] = [label, METHOD, fit_s] if label.isdigit() else ["", label, ""]
            for name in names:
                entry = entries.get(name)
                row += (
                    [f"{v:.4f}" if isinstance(v, float) else v for v in entry] if entry else ["", "", "", ""]
                )
            writer.writerow(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(SWEEP_CONFIG), help="the sweep config (its grid)")
    parser.add_argument("--sweep", default=str(ROOT / "runs/data_scaling/sweep"), help="the sweep's folder")
    parser.add_argument(
        "--baselines",
        default=str(ROOT / "runs/data_scaling/baselines"),
        help="an `lkv eval` folder of the same eval config with training-free methods (optional)",
    )
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="where the summary goes")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    sweep, out = Path(args.sweep), Path(args.out)

    points, missing = [], []  # (N, fit_s, rows)
    for values in grid_points(config["grid"]):
        folder = sweep / "points" / point_name(values)
        if not (folder / "result.json").exists():
            missing.append(values[SIZE_KEY])
            continue
        fit_s = json.loads((folder / "result.json").read_text())["fit_s"]
        points.append((values[SIZE_KEY], fit_s, read_rows(folder / "eval")))
    if not points:
        raise SystemExit(f"no finished point in {sweep}/points; run the sweep first")
    solved, answered = fullkv_solved(points[0][2])
    for n, _, rows in points[1:]:  # FullKV is greedy and adapter-free: every point must agree
        if fullkv_solved(rows)[0] != solved:
            raise SystemExit(f"FullKV solves other needles at N = {n} than at N = {points[0][0]}")
    baseline_rows = read_rows(Path(args.baselines))
    if baseline_rows and fullkv_solved(baseline_rows)[0] != solved:
        raise SystemExit(f"FullKV in {args.baselines} solves other needles than in the sweep")
    baselines = sorted({r["method"] for r in baseline_rows} - {"fullkv"})

    lkv = {n: method_scores(rows, METHOD, solved) for n, _, rows in points}
    refs = {m: method_scores(baseline_rows, m, solved) for m in baselines}
    table = [(str(n), f"{fit_s:.0f}", summarize(lkv[n])) for n, fit_s, _ in points]
    table += [(m, "", summarize(refs[m])) for m in baselines]
    names = sorted({k for _, _, e in table for k in e}, key=lambda k: (k.split("@")[0], int(k.split("@")[1])))
    write_csv(out / "summary.csv", table, names)

    status = "complete" if not missing else f"PARTIAL: points N = {missing} not finished"
    lines = [f"# Data scaling: held-out Recall@C and OOD needle retention vs training prompts ({status})", ""]
    lines += [
        "Mean [95 % interval] (n). Recall@C: of the held-out labels, bootstrap interval. Retention@C: of the "
        f"{len(solved)} out-of-distribution needles FullKV solves (of {answered}, question-aware), the share "
        "the method also solves, Wilson interval. Rows by N are LookaheadKV; the others are training-free "
        "methods on the same samples.",
        "",
        "| N prompts / method | fit (min) | " + " | ".join(names) + " |",
        "|" + "---|" * (len(names) + 2),
    ]
    for label, fit_s, entries in table:
        minutes = f"{float(fit_s) / 60:.0f}" if fit_s else ""
        cells = [_cell(entries.get(k), percent=k.startswith("retention")) for k in names]
        lines.append(f"| {label} | {minutes} | " + " | ".join(cells) + " |")
    comparisons = [(f"N = {n} vs {m}", compare(lkv[n], refs[m])) for n, _, _ in points for m in baselines]
    if len(points) > 1:
        first, last = points[0][0], points[-1][0]
        comparisons.append((f"N = {last} vs N = {first}", compare(lkv[last], lkv[first])))
    if comparisons:
        lines += [
            "",
            "Paired differences on the same samples: LookaheadKV minus the other (points; wins/losses, two-sided "
            "p: exact McNemar for retention, paired bootstrap for recall). **Bold**: p < 0.05.",
            "",
            "| comparison | " + " | ".join(names) + " |",
            "|" + "---|" * (len(names) + 1),
        ]
        for label, results in comparisons:
            cells = [_paired_cell(results.get(k), percent=k.startswith("retention")) for k in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "![scaling](scaling.png)"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(out / "scaling.png", table, names, config, missing)
    print(f"{len(points)} points done, missing {missing}; wrote {out / 'summary.md'}")


def plot(
    path: Path, table: list[tuple[str, str, dict[str, Entry]]], names: list[str], config: dict, missing: list
) -> None:
    """Recall@C and retention@C against N (error bars: 95 % intervals); baselines as dashed lines with bands."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    axes = dict(zip(("recall", "retention"), fig.subplots(1, 2), strict=True))
    sizes = config["grid"][SIZE_KEY]
    colours = {name: f"C{i}" for i, name in enumerate(k for k in names if k.startswith("retention"))}
    colours |= {name: f"C{i}" for i, name in enumerate(k for k in names if k.startswith("recall"))}
    for name in names:
        kind = name.split("@")[0]
        ax, scale = axes[kind], 100 if kind == "retention" else 1
        points = [(int(label), e[name]) for label, _, e in table if label.isdigit() and name in e]
        if points:
            xs = [n for n, _ in points]
            ys = [scale * e[0] for _, e in points]
            errors = [[scale * (e[0] - e[1]) for _, e in points], [scale * (e[2] - e[0]) for _, e in points]]
            ax.errorbar(
                xs, ys, yerr=errors, marker="o", capsize=3, color=colours[name], label=f"LookaheadKV {name}"
            )
        for style, (label, _, entries) in zip(
            cycle(("--", ":", "-.")), [r for r in table if not r[0].isdigit()], strict=False
        ):
            if name in entries:
                mean, low, high, _ = entries[name]
                ax.axhline(
                    scale * mean, color=colours[name], linestyle=style, linewidth=1, label=f"{label} {name}"
                )
                ax.axhspan(scale * low, scale * high, color=colours[name], alpha=0.07)
    for ax in axes.values():
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel(f"training prompts (fixed {config['overrides']['trainer.max_steps']} steps)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes["recall"].set_ylabel("held-out Recall@C")
    axes["retention"].set_ylabel("OOD needles: % of FullKV-solved kept")
    fig.suptitle("data scaling, SmolLM2-135M" + ("" if not missing else f" — partial, N = {missing} missing"))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
