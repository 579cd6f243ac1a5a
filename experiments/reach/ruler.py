"""The RULER table of issue 27 (item 4): per-task scores and FullKV-solved retention, at 4K and 8K tokens.

    python experiments/reach/ruler.py [--runs experiments/reach/ruler_4k experiments/reach/ruler_8k]
        [--out experiments/reach/ruler.md]

Each run is an ``lkv eval`` folder of ``experiments/reach/configs/reach_ruler_{4k,8k}.yaml``. Per run:

- **Scores**: each method's mean ``string_match`` × 100 per task and budget (n samples per task in the
  header), and its mean over the tasks FullKV scores above 0 on. Tasks FullKV scores 0 on are listed apart,
  never averaged in.
- **Kept**: of the (task, sample) pairs FullKV answers fully (score 1), the share each method still answers
  fully, Wilson 95 %, pooled over tasks.
- **Paired**: each LookaheadKV module against the strongest competitor of each budget (the highest kept share
  among the methods that evict before decoding and need no Oracle: Quest keeps the whole cache and the Oracle
  reads the answer), on the same FullKV-solved pairs, exact McNemar.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from analyze import BUDGETS, FULL, _kept, _order, fullkv_solved, paired_cell, read

ROOT = Path(__file__).resolve().parents[2]
NOT_COMPETITORS = ("fullkv", "oracle", "quest")  # reference, upper bound, full-cache decode-time selection


def is_lookahead(method: str) -> bool:
    return method == "lookaheadkv" or method.startswith("lookaheadkv:")


def score_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: mean score × 100 per (method, task) at each budget; FullKV-unsolvable tasks set apart."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    by_cell: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (method, budget, task) → scores
    for r in rows:
        by_cell[(r["method"], r["budget"], r["task"])].append(r["score"])
    full = {t: by_cell[("fullkv", FULL, t)] for t in tasks}
    solvable = [t for t in tasks if full[t] and sum(full[t]) > 0]
    unsolvable = [t for t in tasks if t not in solvable]
    n = {t: len(full[t]) for t in tasks}
    lines = [
        "Mean string_match × 100 per task (n samples: "
        + ", ".join(f"{t} {n[t]}" for t in tasks)
        + "); *mean* = over the tasks FullKV scores above 0 on.",
        "",
    ]
    if unsolvable:
        lines += [f"FullKV scores 0 on {', '.join(unsolvable)}: listed, not averaged in.", ""]

    def row(method: str, budget: str) -> str:
        cells = [by_cell.get((method, budget, t)) for t in tasks]
        means = [100 * sum(c) / len(c) if c else None for c in cells]
        avg = [m for t, m in zip(tasks, means, strict=True) if t in solvable and m is not None]
        text = ["–" if m is None else f"{m:.0f}" for m in means]
        mean = f"**{sum(avg) / len(avg):.1f}**" if len(avg) == len(solvable) and avg else "–"
        return f"| {method} | " + " | ".join(text) + f" | {mean} |"

    header = "| method | " + " | ".join(tasks) + " | mean |"
    rule = "|---|" + "---:|" * (len(tasks) + 1)
    lines += ["**FullKV**", "", header, rule, row("fullkv", FULL), ""]
    methods = [m for m in _order(r["method"] for r in rows) if m != "fullkv"]
    for budget in BUDGETS:
        lines += [f"**C = {budget}**", "", header, rule]
        lines += [row(m, budget) for m in methods if any((m, budget, t) in by_cell for t in tasks)]
        lines.append("")
    return lines


def kept_outcomes(
    rows: list[dict[str, Any]],
) -> tuple[set[tuple[str, str]], dict[tuple[str, str], dict[tuple[str, str], float]]]:
    """The FullKV-solved (task, sample) pairs of ``rows`` (one setting) and, per (method, budget), 1.0 / 0.0 for
    each of them that method scored: whether it still answers fully."""
    solved = fullkv_solved(rows, rows[0]["setting"]) if rows else set()
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]] = defaultdict(dict)
    for r in rows:
        key = (r["task"], r["sample"])
        if r["method"] != "fullkv" and key in solved:
            outcome[(r["method"], r["budget"])][key] = float(r["score"] == 1.0)
    return solved, outcome


def kept_tables(
    rows: list[dict[str, Any]],
    budgets: tuple[str, ...] = BUDGETS,
    before: str | None = "lookaheadkv",
    versus: tuple[str, ...] = (),
) -> list[str]:
    """Markdown: FullKV-solved pairs kept per method and budget, LookaheadKV vs the strongest competitor, the
    other modules vs ``before`` (the committed module unpooled, or None: no such table) and, per module of
    ``versus``, that module against every other method; ``rows`` of one setting."""
    solved, outcome = kept_outcomes(rows)
    if not solved:
        return []
    methods = [m for m in _order(r["method"] for r in rows) if m != "fullkv"]
    samples = {(r["task"], r["sample"]) for r in rows}
    lines = [
        f"FullKV answers {len(solved)} of {len(samples)} (task, sample) pairs fully. Kept: of those, the pairs "
        "each method still answers fully, Wilson 95 %.",
        "",
        *budget_header("method", budgets),
    ]
    for method in methods:
        cells = [_kept(list(outcome.get((method, b), {}).values())) for b in budgets]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    modules = [m for m in methods if is_lookahead(m)]
    strongest = strongest_competitors(outcome, methods, budgets)
    if modules and strongest:
        lines += [
            "",
            "Paired against the strongest competitor of each budget (named in the cell): points (wins/losses), "
            "exact McNemar p; **bold** = p < 0.05.",
            "",
            *paired_lines(outcome, modules, strongest),
        ]
    after = [m for m in modules if m != before]
    if before in modules and after:
        lines += [
            f"Each other module against `{before}`, same pairs:",
            "",
            *paired_lines(outcome, after, dict.fromkeys(budgets, before)),
        ]
    for module in (m for m in versus if m in methods):
        lines += versus_lines(outcome, module, methods, budgets)
    return lines


def budget_header(first: str, budgets: list[str] | tuple[str, ...]) -> list[str]:
    """A markdown table's header and rule: ``first``'s column, then one right-aligned column per budget."""
    return [
        "| " + first + " | " + " | ".join(f"C={b}" for b in budgets) + " |",
        "|---|" + "---:|" * len(budgets),
    ]


def strongest_competitors(
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]], methods: list[str], budgets: tuple[str, ...]
) -> dict[str, str]:
    """Budget → the competitor with the highest kept share (no LookaheadKV module, reference or Oracle) among
    those that scored every FullKV-solved pair of the budget (a method run on part of the samples is shown,
    never the rival)."""
    competitors = [m for m in methods if m not in NOT_COMPETITORS and not is_lookahead(m)]
    strongest = {}
    for budget in budgets:
        scored = {m: outcome.get((m, budget), {}) for m in competitors}
        most = max((len(v) for v in scored.values()), default=0)
        shares = {m: sum(v.values()) / len(v) for m, v in scored.items() if v and len(v) == most}
        if shares:
            strongest[budget] = max(shares, key=shares.get)
    return strongest


def paired_lines(
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]], modules: list[str], rival: dict[str, str]
) -> list[str]:
    """Each of ``modules`` − ``rival[budget]`` on the same FullKV-solved pairs: points (wins/losses), exact
    McNemar p, the rival named in the cell."""
    budgets = list(rival)
    lines = budget_header("module", budgets)
    for module in modules:
        cells = []
        for budget in budgets:
            mine, theirs = outcome.get((module, budget), {}), outcome.get((rival.get(budget), budget), {})
            cell = paired_cell(mine, theirs, [k for k in mine if k in theirs])
            cells.append(cell if cell == "–" else f"{cell} vs {rival[budget]}")
        lines.append(f"| {module} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def versus_lines(
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]],
    module: str,
    methods: list[str],
    budgets: tuple[str, ...],
) -> list[str]:
    """``module`` − each other method on the same FullKV-solved pairs, per budget: points with the 95 %
    interval (wins/losses), exact McNemar p; positive where ``module`` leads, negative where it trails."""
    lines = [
        f"`{module}` against each method, same pairs (its lead > 0, its gap < 0; 95 % interval (Newcombe, paired), "
        "wins/losses, exact McNemar p):",
        "",
        *budget_header("against", budgets),
    ]
    for method in (m for m in methods if m != module):
        cells = []
        for budget in budgets:
            mine, theirs = outcome.get((module, budget), {}), outcome.get((method, budget), {})
            cells.append(paired_cell(mine, theirs, [k for k in mine if k in theirs], interval=True))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def run_section(folder: Path) -> list[str]:
    rows = [r for r in read(folder) if r["setting"] == "aware"]
    if not rows:
        return []
    lengths = sorted({r["meta"]["length"] for r in rows})
    title = f"## {folder.name}: prompts of {', '.join(str(n) for n in lengths)} tokens"
    return [
        title,
        "",
        "### Scores",
        "",
        *score_tables(rows),
        "### FullKV-solved kept",
        "",
        *kept_tables(rows),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    runs = [ROOT / "experiments/reach/ruler_4k", ROOT / "experiments/reach/ruler_8k"]
    parser.add_argument("--runs", type=Path, nargs="+", default=runs)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments/reach/ruler.md")
    args = parser.parse_args(argv)
    sections = [line for folder in args.runs for line in run_section(folder)]
    args.out.write_text("\n".join(["# Reach: the RULER table", "", *sections]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
