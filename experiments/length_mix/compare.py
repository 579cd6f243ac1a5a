"""LookaheadKV trained on ~1K prompts vs on a 1K + 3K length mix, on the same needles: table with intervals.

    python experiments/length_mix/compare.py [--base experiments/full_evidence/results]
        [--mix runs/length_mix/eval] [--out experiments/length_mix]

Both folders are ``lkv eval`` runs of ``configs/eval/full_evidence.yaml`` (question-aware rows): ``--base``
with the committed adapter (the data-scaling N = 512 point, ~1K-token training prompts), ``--mix`` with the
length-mix adapter. Per needle group (in- and out-of-distribution), context length and budget it gives each
adapter's retention of the samples FullKV solves (``k / n``, Wilson 95 % interval) and the paired exact
McNemar test of the mix against the base on those samples. Writes ``summary.md`` and ``summary.csv`` and
copies the mix's LookaheadKV rows to ``--out/results/lookaheadkv_rows.jsonl``.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from lkv.eval.cells import FULL
from lkv.eval.paired import pair_by_sample
from lkv.eval.results import RESULTS_FILE, ResultsFile
from lkv.eval.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("needle_id", "needle_ood")
ALL = 1_000_000  # the length key of a group's every length pooled (sorts last)

Cell = tuple[str, int, str]  # task, context length, budget


def lookahead_scores(
    rows: list[dict[str, Any]], solved: set[tuple[str, str]]
) -> dict[Cell, dict[str, float]]:
    """(task, length, budget) → {sample: 0/1} of LookaheadKV on the FullKV-solved question-aware needles;
    length :data:`ALL` pools the lengths."""
    out: dict[Cell, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["method"] == "lookaheadkv" and r["setting"] == "aware" and (r["task"], r["sample"]) in solved:
            for length in (r["meta"]["length"], ALL):
                out[(r["task"], length, r["budget"])][r["sample"]] = r["score"]
    return out


def fullkv_solved(rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {
        (r["task"], r["sample"])
        for r in rows
        if r["method"] == "fullkv" and r["setting"] == "aware" and r["budget"] == FULL and r["score"] == 1.0
    }


def retention(scores: dict[str, float]) -> str:
    k, n = int(sum(scores.values())), len(scores)
    if not n:
        return "–"
    low, high = wilson_interval(k, n)
    return f"{k}/{n} = {100 * k / n:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, default=ROOT / "experiments/full_evidence/results")
    parser.add_argument("--mix", type=Path, default=ROOT / "runs/length_mix/eval")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    base_rows = ResultsFile(args.base / RESULTS_FILE).rows
    mix_rows = ResultsFile(args.mix / RESULTS_FILE).rows
    solved = fullkv_solved(base_rows)
    if fullkv_solved(mix_rows) != solved:
        raise SystemExit(
            f"FullKV solves other needles in {args.mix} than in {args.base}: not the same samples"
        )
    base, mix = lookahead_scores(base_rows, solved), lookahead_scores(mix_rows, solved)
    cells = sorted(set(base) & set(mix), key=lambda c: (TASKS.index(c[0]), c[1], float(c[2])))
    lines = [
        "# LookaheadKV: ~1K-token training prompts vs a 1K + 3K length mix (question-aware needles)",
        "",
        "Retention: of the needles FullKV solves, the ones LookaheadKV also solves (k/n, Wilson 95 % interval).",
        "Mix − base: paired on the same samples, points (mix wins/base wins, exact McNemar p); **bold**: p < 0.05.",
        "",
        "| group | length | C | base adapter | length-mix adapter | mix − base |",
        "|---|---:|---:|---|---|---|",
    ]
    table = []
    for task, length, budget in cells:
        b, m = base[(task, length, budget)], mix[(task, length, budget)]
        test = pair_by_sample(m, b)
        mark = "**" if test is not None and test.significant else ""
        paired = (
            "–"
            if test is None
            else f"{mark}{100 * test.diff:+.1f}{mark} ({test.wins}/{test.losses}, p={test.p:.2g})"
        )
        shown = "all" if length == ALL else length
        lines.append(f"| {task} | {shown} | {budget} | {retention(b)} | {retention(m)} | {paired} |")
        table.append(
            {
                "task": task,
                "length": shown,
                "budget": budget,
                "n": len(b),
                "base_kept": int(sum(b.values())),
                "mix_kept": int(sum(m.values())),
                "diff": None if test is None else test.diff,
                "p": None if test is None else test.p,
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    with (args.out / "summary.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]) if table else ["task"])
        writer.writeheader()
        writer.writerows(table)
    (args.out / "results").mkdir(exist_ok=True)
    with (args.out / "results" / "lookaheadkv_rows.jsonl").open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(r) + "\n" for r in mix_rows if r["method"] == "lookaheadkv")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
