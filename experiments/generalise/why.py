"""Why a needle the full cache answers is lost after eviction, per cell of the generalisation signal: its value
was evicted from the heads the answer reads it from, or it was kept there and the answer still went wrong.

    python experiments/generalise/why.py ANSWERS [MORE ANSWERS] --tokens TOKENS [--methods M ...] [--held 0.9]

ANSWERS are ``lkv eval`` folders of the ``generalise`` task (answers decoded; merged by sample as
``summary.py`` merges them, FOLDER@NAME renames one folder's methods); TOKENS is a folder of the needle-token
diagnostic over the same needles (``configs/dev_tokens.yaml``: ``NeedleTokenTask`` over ``GeneraliseTask``),
whose methods carry their names without ``@NAME``. Only FullKV-solved needles count. Per method, budget and cell
(source group × distance bin, and kind side): the needles it answers and loses, and the losses split by the
share of the Oracle's heads (where the answer's own attention keeps the whole value at that budget) in which the
method keeps the whole value too: below ``--held`` the value was evicted, at or above it the value was kept and
the answer failed on what else the cache kept or lost. "no head" counts needles where the Oracle's selection
keeps the whole value in no head. Beside them: the mean share of the value's tokens kept over all heads, the
method's and the Oracle's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from summary import TASK, folder_rows, merged_rows

from lkv.eval.paired import fullkv_solved
from lkv.eval.results import FULL
from lkv.eval.tasks.needle_tokens import held_in_oracle_heads

TOKENS_TASK = f"{TASK}_tokens"
# the cells: (source group, bin) and kind side, as the summary's first tables group them
CELLS: tuple[tuple[str, ...], ...] = (("source_group", "bin"), ("kind_side",))


def why_lines(
    answers: Sequence[dict[str, Any]],
    tokens: Sequence[dict[str, Any]],
    methods: Sequence[str],
    held: float = 0.9,
    setting: str = "aware",
) -> list[str]:
    """Markdown lines: one table per cell grouping of :data:`CELLS` (see the module docstring).

    ``methods`` name methods of ``answers``; a method ``name@folder`` is looked up in ``tokens`` as ``name``.
    """
    solved = fullkv_solved(answers, TASK, setting)
    if not solved:
        raise ValueError(f"no {TASK} sample that FullKV solved in setting {setting!r}")
    meta = {r["sample"]: r["meta"] for r in answers if r["task"] == TASK and r["sample"] in solved}
    outcome = {
        (r["method"], r["budget"], r["sample"]): r["score"] == 1.0
        for r in answers
        if r["task"] == TASK and r["setting"] == setting and r["budget"] != FULL
    }
    per_head = {(r["method"], r["budget"], r["sample"]): r for r in tokens if r["task"] == TOKENS_TASK}
    if not per_head:
        raise ValueError(f"the tokens folder has no {TOKENS_TASK} row")
    budgets = sorted({b for _, b, _ in per_head}, key=int)
    lines = [
        f"FullKV solved {len(solved)} needles; losses split at {held:.0%} of the Oracle's heads holding the value.",
        "",
    ]
    for keys in CELLS:
        header = [" × ".join(keys), "method", "C", "solved", "answered", "lost", "evicted", "kept, wrong"]
        header += ["no head", "value kept", "Oracle's value kept"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for value in sorted({" / ".join(str(meta[s][k]) for k in keys) for s in solved}):
            cell = sorted(s for s in solved if " / ".join(str(meta[s][k]) for k in keys) == value)
            for method in methods:
                name = method.split("@", 1)[0]
                for budget in budgets:
                    both = [
                        s
                        for s in cell
                        if (method, budget, s) in outcome
                        and (name, budget, s) in per_head
                        and ("oracle", budget, s) in per_head
                    ]
                    if not both:
                        continue
                    lost = [s for s in both if not outcome[(method, budget, s)]]
                    counts = {"evicted": 0, "kept": 0, "none": 0}
                    for s in lost:
                        kept, heads = held_in_oracle_heads(
                            per_head[("oracle", budget, s)]["per_head"],
                            per_head[(name, budget, s)]["per_head"],
                        )
                        counts["none" if not heads else "kept" if kept / heads >= held else "evicted"] += 1
                    mine = sum(per_head[(name, budget, s)]["score"] for s in both) / len(both)
                    oracle = sum(per_head[("oracle", budget, s)]["score"] for s in both) / len(both)
                    row = [value, method, budget, len(both), len(both) - len(lost), len(lost)]
                    row += [counts["evicted"], counts["kept"], counts["none"], f"{mine:.2f}", f"{oracle:.2f}"]
                    lines.append("| " + " | ".join(str(c) for c in row) + " |")
        lines.append("")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answers", nargs="+", help="lkv eval folders of the generalise task (FOLDER@NAME)")
    parser.add_argument("--tokens", required=True, help="lkv eval folder of the needle-token diagnostic")
    parser.add_argument("--methods", nargs="+", default=["lookaheadkv"], help="methods of the answer rows")
    parser.add_argument(
        "--held", type=float, default=0.9, help="share of the Oracle's heads that counts as kept"
    )
    parser.add_argument("--setting", default="aware", choices=("aware", "agnostic"))
    args = parser.parse_args(argv)
    try:
        answers = merged_rows([folder_rows(given, "why") for given in args.answers])
        print(
            "\n".join(
                why_lines(answers, folder_rows(args.tokens, "why"), args.methods, args.held, args.setting)
            )
        )
    except ValueError as error:
        sys.exit(f"why: {error}")


if __name__ == "__main__":
    main()
