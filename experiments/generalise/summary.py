"""The generalisation signal of an ``lkv eval`` folder of the ``generalise`` task: per method and budget, the
FullKV-solved needles it kept, split by source group, source, kind side, kind and measured-distance bin.

    python experiments/generalise/summary.py reports/generalise/dev [--setting aware] > table.md

*Solved* and *kept* are the paired comparisons' (:func:`lkv.eval.paired.fullkv_solved`): a needle counts only
where FullKV answered it, and a method keeps it when it answers it too; each share has its Wilson interval.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lkv.eval.paired import fullkv_solved
from lkv.eval.results import FULL, RESULTS_FILE, ResultsFile, budget_order
from lkv.eval.stats import mcnemar_exact, wilson_interval

TASK = "generalise"
# a grouping is one meta key or a tuple of them (their values joined: "out-of-source / far")
GROUPINGS: tuple[str | tuple[str, ...], ...] = (
    ("source_group", "bin"),
    "source_group",
    "source",
    "kind_side",
    "kind",
    "bin",
)
# the method every other is paired against, per (source group, bin) cell (exact McNemar)
REFERENCE = "lookaheadkv"


def kept_tables(rows: Sequence[dict[str, Any]], setting: str = "aware") -> list[str]:
    """Markdown lines: one table per grouping of :data:`GROUPINGS`, a row per value, a column per
    (method, budget): ``kept/solved = share % [low, high]``."""
    solved = fullkv_solved(rows, TASK, setting)
    mine = [r for r in rows if r["task"] == TASK and r["setting"] == setting and r["budget"] != FULL]
    if not solved:
        raise ValueError(f"no {TASK} sample that FullKV solved in setting {setting!r}")
    meta = {r["sample"]: r["meta"] for r in rows if r["task"] == TASK and r["sample"] in solved}
    columns = sorted({(r["method"], r["budget"]) for r in mine}, key=lambda c: (c[0], budget_order(c[1])))
    scores = {(r["method"], r["budget"], r["sample"]): r["score"] for r in mine}
    lines = [
        f"FullKV solved {len(solved)} needles ({setting}); cells: kept/solved = share [95 % Wilson].",
        "",
    ]
    for grouping in GROUPINGS:
        values = sorted({_value(meta[s], grouping) for s in solved})
        name = " × ".join(grouping) if isinstance(grouping, tuple) else grouping
        header = [name, "solved", *(f"{m} C={b}" for m, b in columns)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for value in values:
            samples = [s for s in solved if _value(meta[s], grouping) == value]
            cells = [value, str(len(samples)), *(_cell(scores, m, b, samples) for m, b in columns)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines + paired_lines(scores, meta, solved, columns)


def paired_lines(
    scores: dict[tuple[str, str, str], float],
    meta: dict[str, dict[str, Any]],
    solved: set[str],
    columns: list[tuple[str, str]],
) -> list[str]:
    """Markdown lines: per (source group × bin) cell and budget, every method against :data:`REFERENCE` on the
    needles both have rows for: the difference in kept share, wins / losses of the reference, exact McNemar p."""
    grouping = ("source_group", "bin")
    lines = [
        f"Paired against {REFERENCE} (same needles): difference in points (other − {REFERENCE}), "
        f"{REFERENCE}'s wins / losses, exact McNemar p.",
        "",
        "| source_group × bin | C | method | n | difference | wins / losses | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for value in sorted({_value(meta[s], grouping) for s in solved}):
        samples = [s for s in solved if _value(meta[s], grouping) == value]
        for method, budget in columns:
            if method == REFERENCE:
                continue
            pairs = [
                (scores[(REFERENCE, budget, s)], scores[(method, budget, s)])
                for s in samples
                if (REFERENCE, budget, s) in scores and (method, budget, s) in scores
            ]
            if not pairs:
                continue
            test = mcnemar_exact([float(b == 1.0) for _, b in pairs], [float(a == 1.0) for a, _ in pairs])
            lines.append(
                f"| {value} | {budget} | {method} | {test.n} | {100 * test.diff:+.0f} | "
                f"{test.losses} / {test.wins} | {test.p:.2g} |"
            )
    return lines


def _value(meta: dict[str, Any], grouping: str | tuple[str, ...]) -> str:
    keys = grouping if isinstance(grouping, tuple) else (grouping,)
    return " / ".join(str(meta[key]) for key in keys)


def _cell(scores: dict[tuple[str, str, str], float], method: str, budget: str, samples: list[str]) -> str:
    run = [scores[(method, budget, s)] for s in samples if (method, budget, s) in scores]
    if not run:
        return "–"
    kept = sum(score == 1.0 for score in run)
    low, high = wilson_interval(kept, len(run))
    return f"{kept}/{len(run)} = {100 * kept / len(run):.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an lkv eval output folder (or its results.jsonl)")
    parser.add_argument("--setting", default="aware", choices=("aware", "agnostic"))
    args = parser.parse_args(argv)
    path = args.folder / RESULTS_FILE if args.folder.is_dir() else args.folder
    if not path.is_file():
        sys.exit(f"summary: no {RESULTS_FILE} at {path}")
    print("\n".join(kept_tables(ResultsFile(path).rows, args.setting)))


if __name__ == "__main__":
    main()
