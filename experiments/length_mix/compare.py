"""LookaheadKV trained on ~1K prompts vs on a 1K + 3K length mix, on the same needles: table with intervals.

    python experiments/length_mix/compare.py [--base experiments/full_evidence/results]
        [--mix runs/length_mix/eval] [--oracle runs/length_probe/oracle] [--out experiments/length_mix]

``--base`` and ``--mix`` are ``lkv eval`` runs of ``experiments/full_evidence/configs/full_evidence.yaml``
(question-aware rows): ``--base`` with the committed adapter (the data-scaling N = 512 point, ~1K-token
training prompts), ``--mix`` with the length-mix adapter; ``--oracle`` is the run of
``experiments/length_mix/configs/length_oracle.yaml`` (3K samples). Per needle group (in- and
out-of-distribution), context length and budget it gives each one's retention of the samples FullKV solves
(``k / n``, Wilson 95 % interval) and the paired exact McNemar test of the mix against the base on those
samples. A missing ``--mix`` or ``--oracle`` folder leaves its column out. Writes ``summary.md`` and
``summary.csv`` and copies the mix's LookaheadKV rows to ``--out/results/lookaheadkv_rows.jsonl``.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from lkv.eval.paired import pair_by_sample
from lkv.eval.results import FULL, RESULTS_FILE, ResultsFile
from lkv.eval.stats import wilson_interval

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("needle_id", "needle_ood")
ALL = 1_000_000  # the length key of a group's every length pooled (sorts last)

Cell = tuple[str, int, str]  # task, context length, budget


def method_scores(
    rows: list[dict[str, Any]], method: str, solved: set[tuple[str, str]]
) -> dict[Cell, dict[str, float]]:
    """(task, length, budget) → {sample: 0/1} of ``method`` on the FullKV-solved question-aware needles of
    :data:`TASKS`; length :data:`ALL` pools the lengths."""
    out: dict[Cell, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["method"] != method or r["task"] not in TASKS or r["setting"] != "aware":
            continue
        if (r["task"], r["sample"]) in solved:
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


def read_folder(folder: Path, solved: set[tuple[str, str]] | None) -> list[dict[str, Any]]:
    """An eval folder's rows; with ``solved`` (the base's FullKV-solved needles), refuse a folder whose
    FullKV solves others among the samples it holds (other samples, or another model)."""
    rows = ResultsFile(folder / RESULTS_FILE).rows
    if solved is not None:
        held = {(r["task"], r["sample"]) for r in rows if r["method"] == "fullkv"}
        if fullkv_solved(rows) != {s for s in solved if s in held}:
            raise SystemExit(
                f"FullKV solves other needles in {folder} than in the base folder: not the same samples"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, default=ROOT / "experiments/full_evidence/results")
    parser.add_argument("--mix", type=Path, default=ROOT / "runs/length_mix/eval")
    parser.add_argument("--oracle", type=Path, default=ROOT / "runs/length_probe/oracle")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    base_rows = read_folder(args.base, None)
    solved = fullkv_solved(base_rows)
    columns = {"base adapter": method_scores(base_rows, "lookaheadkv", solved)}
    mix_rows = read_folder(args.mix, solved) if (args.mix / RESULTS_FILE).exists() else []
    if mix_rows:
        columns["length-mix adapter"] = method_scores(mix_rows, "lookaheadkv", solved)
    if (args.oracle / RESULTS_FILE).exists():
        columns["Oracle (answer attention)"] = method_scores(
            read_folder(args.oracle, solved), "oracle", solved
        )
    base = columns["base adapter"]
    mix = columns.get("length-mix adapter", {})
    cells = sorted(base, key=lambda c: (TASKS.index(c[0]), c[1], float(c[2])))
    lines = [
        "# LookaheadKV by context length: ~1K-token training prompts vs a 1K + 3K length mix",
        "",
        "Question-aware needles of the full evaluation. Retention: of the needles FullKV solves, the ones the",
        "method also solves (k/n, Wilson 95 % interval). Mix − base: paired on the same samples, points (mix",
        "wins/base wins, exact McNemar p); **bold**: p < 0.05. Oracle keeps the prompt tokens FullKV's own",
        "answer attends to most (the module's training target): run on the 3K samples only.",
        "",
        "| group | length | C | " + " | ".join(columns) + (" | mix − base |" if mix else " |"),
        "|---|---:|---:|" + "---|" * (len(columns) + bool(mix)),
    ]
    table = []
    for cell in cells:
        task, length, budget = cell
        shown = "all" if length == ALL else length
        entries = {name: scores.get(cell, {}) for name, scores in columns.items()}
        line = f"| {task} | {shown} | {budget} | " + " | ".join(retention(v) for v in entries.values()) + " |"
        record: dict[str, Any] = {"task": task, "length": shown, "budget": budget, "n": len(base[cell])}
        record |= {f"{name} kept": int(sum(v.values())) if v else None for name, v in entries.items()}
        if mix:
            test = pair_by_sample(mix.get(cell, {}), base[cell])
            mark = "**" if test is not None and test.significant else ""
            line += (
                " – |"
                if test is None
                else f" {mark}{100 * test.diff:+.1f}{mark} ({test.wins}/{test.losses}, p={test.p:.2g}) |"
            )
            record |= {
                "mix - base": None if test is None else test.diff,
                "p": None if test is None else test.p,
            }
        lines.append(line)
        table.append(record)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    with (args.out / "summary.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    if mix_rows:
        (args.out / "results").mkdir(exist_ok=True)
        with (args.out / "results" / "lookaheadkv_rows.jsonl").open("w", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in mix_rows if r["method"] == "lookaheadkv")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
