"""Why a far needle is lost after eviction: its value was not kept, or it was kept and the answer still went
wrong. Joins an end-task folder (answers decoded) with a prefill-only needle-token folder of the same samples
(``NeedleTokenTask`` over the same ``NeedleFamilyTask``), row by row: (sample, method, budget).

    python experiments/reach/kept_vs_answered.py ANSWERS TOKENS [--methods lookaheadkv ...]
        [--budgets 128 256] [--out FILE]

Only FullKV-solved needles count, grouped as ``far_kinds.py`` groups them (1K, near, far). A mean share of the
value's tokens over all (layer, KV head) barely tells answered from lost needles (most heads never attend to
the value), so the measure is per head, against the Oracle: of the heads where the Oracle's selection (the
answer's own attention) keeps the whole value at that budget, the share where the method's keeps it whole too
("Oracle's heads held"). Per method and budget: the needles it answers, the mean of that share over the
answered and over the lost needles (bootstrap 95 %), and the losses split at ``--held`` (default 0.9): a loss
that holds the value in ≥ 90 % of the Oracle's heads is not the value evicted but the answer going wrong on
what else the cache keeps or lacks. A second table counts, per method, the needles answered at one budget and
lost at the next larger one, and the reverse.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from analyze import _kept, _mid, _pct, read, solved_outcomes
from far_kinds import place

from lkv.eval.tasks.needle_tokens import held_in_oracle_heads


def oracle_heads_held(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """(sample, method, budget) → of the (layer, KV head)s where the Oracle keeps the whole value, the share
    where ``method`` does too (absent where the Oracle keeps it whole in no head)."""
    per_head = {(r["sample"], r["method"], r["budget"]): r["per_head"] for r in rows}
    held = {}
    for (sample, method, budget), mine in per_head.items():
        kept, heads = held_in_oracle_heads(per_head.get((sample, "oracle", budget), []), mine)
        if heads:
            held[(sample, method, budget)] = kept / heads
    return held


def _mean(values: list[float]) -> str:
    return _pct(*_mid(values)) if values else "–"


def tables(
    answers: list[dict[str, Any]],
    tokens: list[dict[str, Any]],
    methods: list[str],
    budgets: list[str],
    threshold: float,
) -> list[str]:
    """Markdown: answered vs lost with the Oracle's heads held, and losses at a larger budget, per place."""
    solved, outcome, meta = solved_outcomes([r for r in answers if r["setting"] == "aware"])
    kept = oracle_heads_held(tokens)
    places = sorted({place(meta[k]) for k in solved} - {None})
    lines: list[str] = []
    for where in places:
        # a fixed order: the bootstrap draws by index, and a set's order changes from run to run
        keys = sorted(k for k in solved if place(meta[k]) == where)
        lines += [
            f"## {where} (FullKV solves {len(keys)})",
            "",
            "Oracle's heads held: of the (layer, KV head)s where the Oracle keeps the whole value, the share "
            "where the method does too, × 100, mean over needles with a bootstrap 95 % interval; losses split "
            f"at {threshold:g} of those heads.",
            "",
            "| method | C | answered | Oracle's heads held, answered | held, lost | "
            f"lost, held ≥ {threshold:g} | lost, held < {threshold:g} |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for method in methods:
            for budget in budgets:
                scores = outcome.get((method, budget), {})
                mine = [k for k in keys if k in scores and (k[1], method, budget) in kept]
                if not mine:
                    continue
                won = [k for k in mine if scores[k] == 1.0]
                lost = [k for k in mine if scores[k] < 1.0]
                share = {k: kept[(k[1], method, budget)] for k in mine}
                held = [k for k in lost if share[k] >= threshold]
                lines.append(
                    f"| {method} | {budget} | {_kept([scores[k] for k in mine])} | {_mean([share[k] for k in won])} "
                    f"| {_mean([share[k] for k in lost])} | {len(held)} | {len(lost) - len(held)} |"
                )
        lines += [
            "",
            "Needles answered at the smaller budget and lost at the larger one (and the reverse), same method:",
            "",
            "| method | budgets | answered → lost | lost → answered |",
            "|---|---|---:|---:|",
        ]
        for method in methods:
            for small, large in itertools.pairwise(budgets):
                a, b = outcome.get((method, small), {}), outcome.get((method, large), {})
                both = [k for k in keys if k in a and k in b]
                worse = sum(a[k] == 1.0 and b[k] < 1.0 for k in both)
                better = sum(a[k] < 1.0 and b[k] == 1.0 for k in both)
                lines.append(f"| {method} | {small} → {large} | {worse} of {len(both)} | {better} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("answers", type=Path, help="lkv eval folder with decoded answers")
    parser.add_argument("tokens", type=Path, help="lkv eval folder of NeedleTokenTask rows, same samples")
    parser.add_argument("--methods", nargs="+", default=None, help="default: every method in both folders")
    parser.add_argument("--budgets", nargs="+", default=["128", "256"])
    parser.add_argument(
        "--held", type=float, default=0.9, help="share of the Oracle's heads: a loss holds the value"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    answers, tokens = read(args.answers), read(args.tokens)
    if not answers or not tokens:
        raise SystemExit(f"no rows in {args.answers if not answers else args.tokens}")
    both = {r["method"] for r in answers} & {r["method"] for r in tokens}
    methods = args.methods or sorted(both - {"fullkv"})
    text = "\n".join(tables(answers, tokens, methods, args.budgets, args.held))
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
