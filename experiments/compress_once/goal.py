"""The goal of experiments/compress_once/PLAN.md (its analysis 2): each agnostic LookaheadKV module against the
strongest competitor of each budget, on the same FullKV-solved questions, read as the plan fixes it.

    python experiments/compress_once/goal.py experiments/compress_once/results/preregistered \
        --modules lookaheadkv lookaheadkv:agnostic_s1 --budgets 0.5 0.25 [--by source_group] [--no-goal]

The strongest competitor is ``ruler.strongest_competitors``' (the most kept among every method but FullKV, the
Oracle and the LookaheadKV modules). Per (module, budget): module − competitor in points with the 95 %
interval (Newcombe's, paired), wins / losses and the exact two-sided McNemar p (``lkv.eval.stats.mcnemar_exact``); the p values of
every cell Holm-adjusted together. **Met** when the difference is ≥ 0; the reading is **a lead** (> 0, p < 0.05),
**a gap** (< 0, p < 0.05) or **within noise** ("no gap larger than" the interval's lower bound at this n). The
goal holds when every cell is met; ``--no-goal`` leaves its line out, for budgets read without a goal. With
``--by KEY``, the same table once more per value of the rows' ``meta[KEY]``, each on its own questions and
competitor (no goal is read on a part).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reach"))
from analyze import read  # noqa: E402
from ruler import kept_outcomes, strongest_competitors  # noqa: E402

from lkv.eval.stats import PairedResult, mcnemar_exact  # noqa: E402

NOISE_P = 0.05


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` (family-wise error), in their given order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def reading(test: PairedResult) -> str:
    """The plan's words for one paired cell."""
    if test.p < NOISE_P:
        return "a lead" if test.diff > 0 else "a gap"
    return f"within noise: no gap larger than {max(0.0, -100 * test.low):.1f} points at n = {test.n}"


def cells(
    rows: list[dict[str, Any]], modules: Sequence[str], budgets: Sequence[str]
) -> list[tuple[str, str, str, PairedResult]]:
    """``(module, budget, competitor, module − competitor)`` for each module and budget, on the FullKV-solved
    questions both scored; a module or competitor missing a solved question is an error (every method of the
    plan runs on every question)."""
    solved, outcome = kept_outcomes(rows)
    if not solved:
        raise ValueError("FullKV answers none of these questions")
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "fullkv"))
    rival = strongest_competitors(outcome, methods, tuple(budgets))
    keys = sorted(solved)
    out = []
    for module in modules:
        for budget in budgets:
            if budget not in rival:
                raise ValueError(f"no competitor scored the FullKV-solved questions at budget {budget}")
            mine, theirs = outcome.get((module, budget), {}), outcome[(rival[budget], budget)]
            missing = [k for k in keys if k not in mine or k not in theirs]
            if missing:
                raise ValueError(
                    f"{module} or {rival[budget]} at budget {budget} has no row for {len(missing)} "
                    f"FullKV-solved question(s), e.g. {missing[0]}"
                )
            test = mcnemar_exact([mine[k] for k in keys], [theirs[k] for k in keys])
            out.append((module, budget, rival[budget], test))
    return out


def table(found: list[tuple[str, str, str, PairedResult]]) -> list[str]:
    """Markdown lines: one row per cell of :func:`cells`, its p Holm-adjusted over all of them."""
    adjusted = holm([test.p for *_, test in found])
    lines = [
        "| module | budget | strongest competitor | n | module − competitor, points [95 %] | wins / losses "
        "| p | Holm p | met (≥ 0) | reading |",
        "|---|---|---|---:|---|---|---:|---:|---|---|",
    ]
    for (module, budget, rival, test), p_holm in zip(found, adjusted, strict=True):
        lines.append(
            f"| {module} | {budget} | {rival} | {test.n} | {100 * test.diff:+.1f} [{100 * test.low:+.1f}, "
            f"{100 * test.high:+.1f}] | {test.wins} / {test.losses} | {test.p:.2g} | {p_holm:.2g} "
            f"| {'yes' if test.diff >= 0 else 'no'} | {reading(test)} |"
        )
    return lines


def goal(found: list[tuple[str, str, str, PairedResult]]) -> str:
    """Whether the goal holds: every cell met (difference ≥ 0)."""
    met = sum(test.diff >= 0 for *_, test in found)
    return f"Goal: {'holds' if met == len(found) else 'does not hold'} (met in {met} of {len(found)} cells)."


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the lkv eval folder of the set")
    parser.add_argument("--modules", nargs="+", required=True, help="the LookaheadKV methods, one per seed")
    parser.add_argument("--budgets", nargs="+", required=True)
    parser.add_argument("--by", help="also per value of this meta key (e.g. source_group)")
    parser.add_argument(
        "--tasks",
        nargs="+",
        help="only these tasks' rows (e.g. kvpress's protocol: the tasks FullKV solves, those with method rows)",
    )
    parser.add_argument(
        "--no-goal",
        action="store_true",
        help="the tables only, no goal line (PLAN.md's analysis 3: C = 128, 256)",
    )
    args = parser.parse_args(argv)
    rows = [r for r in read(args.folder) if args.tasks is None or r["task"] in args.tasks]
    settings = {r["setting"] for r in rows}
    if len(settings) != 1:
        sys.exit(
            f"goal: expected the rows of one setting in {args.folder}, found {sorted(settings) or 'none'}"
        )
    try:
        found = cells(rows, args.modules, args.budgets)
        lines = table(found) if args.no_goal else [*table(found), "", goal(found)]
        values = dict.fromkeys(r["meta"][args.by] for r in rows if args.by and args.by in r["meta"])
        for value in values:
            part = [r for r in rows if r["meta"].get(args.by) == value]
            lines += [
                "",
                f"{args.by} = {value} (no goal is read on a part):",
                "",
                *table(cells(part, args.modules, args.budgets)),
            ]
    except ValueError as error:
        sys.exit(f"goal: {error}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
