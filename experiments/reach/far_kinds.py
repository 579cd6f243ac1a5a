"""Far needles by kind: of the FullKV-solved needles, how many each method keeps, split by where the needle
sits (1K prompts; near and far in prompts ≥ 3K tokens) and by what it is (a trained fact format in essays, an
evaluation-only one in essays, one in Python docs), with each module paired against a reference.

    python experiments/reach/far_kinds.py FOLDER[=NAME] [...] [--reference lookaheadkv]
        [--methods lookaheadkv lookaheadkv:far_s0 ...] [--budgets 128 256] [--out FILE]
        [--alias NEW=OLD ...] [--intervals]

A needle is far when it sits ≥ 1.5K tokens before the end of a prompt of ≥ 3K tokens and near when ≤ 1K
(experiments/reach/analyze.py's split): by ``meta["distance"]`` where the task placed needles by distance,
otherwise by depth (``depth ≤ 0.5`` far, ``≥ 0.7`` near, the issue's split of 3K-token prompts). Several
folders (the same samples scored by more modules) are merged as ``strongest.py`` merges them. ``--alias
NEW=OLD`` reads method ``OLD``'s rows as ``NEW``'s, so one setting named differently in the folders of
different needle sets pools into one row (a needle scored under both names is refused). ``--intervals`` adds
each paired difference's 95 % interval (Newcombe, paired).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analyze import FAR, FAR_MIN_LENGTH, NEAR, _kept, paired_cell, solved_outcomes
from strongest import merged

from lkv.eval.results import row_key

SHORT = 2000  # prompts below this many tokens are the 1K group


def place(meta: dict[str, Any]) -> str | None:
    """``1K``, ``near``, ``far`` or None (between near and far)."""
    if meta["length"] < SHORT:
        return "1K"
    if "distance" in meta:
        far = meta["distance"] >= FAR and meta["length"] >= FAR_MIN_LENGTH
        return "far" if far else "near" if meta["distance"] <= NEAR else None
    return "far" if meta["depth"] <= 0.5 else "near" if meta["depth"] >= 0.7 else None


def kind(meta: dict[str, Any]) -> str:
    """``trained`` (a training fact format), ``unseen, essays`` or ``unseen, pydoc``."""
    if meta["distribution"] == "in-distribution":
        return "trained"
    return f"unseen, {meta['haystack']}"


def tables(
    rows: list[dict[str, Any]],
    methods: list[str],
    reference: str,
    budgets: list[str],
    intervals: bool = False,
) -> list[str]:
    """Markdown: kept counts per (place, kind) group and per place, by budget, then each method − reference
    paired on the same groups."""
    rows = [r for r in rows if r["setting"] == "aware" and "family" in r.get("meta", {})]
    solved, outcome, meta = solved_outcomes(rows)
    where = {k: (place(meta[k]), kind(meta[k])) for k in solved}  # FullKV-solved key → (place, kind)
    groups = sorted({g for g in where.values() if g[0]})
    places = sorted({p for p, _ in groups})
    # a column is a (place, kind) group, or a place with every kind ("all")
    columns = [*groups, *((p, "all") for p in places)]

    def members(column: tuple[str, str], keys: list) -> list:
        return [s for s in keys if where[s] == column or (column[1] == "all" and where[s][0] == column[0])]

    header = " | ".join(f"{p}, {k} (n = {len(members((p, k), list(where)))})" for p, k in columns)
    lines = ["| method | C | " + header + " |", "|---|---|" + "---:|" * len(columns)]
    for method in methods:
        for budget in budgets:
            scores = outcome.get((method, budget), {})
            cells = [_kept([scores[s] for s in members(c, list(scores))]) for c in columns]
            lines.append(f"| {method} | {budget} | " + " | ".join(cells) + " |")
    spread = ", 95 % interval (Newcombe, paired)" if intervals else ""
    lines += ["", f"Paired against {reference} (points{spread}, wins/losses, exact McNemar p):", ""]
    lines += [
        "| method | C | " + " | ".join(f"{p}, {k}" for p, k in columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for method in (m for m in methods if m != reference):
        for budget in budgets:
            mine, theirs = outcome.get((method, budget), {}), outcome.get((reference, budget), {})
            common = [s for s in mine if s in theirs]
            cells = [paired_cell(mine, theirs, members(c, common), intervals) for c in columns]
            lines.append(f"| {method} | {budget} | " + " | ".join(cells) + " |")
    return lines + [""]


def aliased(rows: list[dict[str, Any]], aliases: dict[str, str]) -> list[dict[str, Any]]:
    """``rows`` with each method in ``aliases`` (old → new) renamed; a (task, sample, budget, setting) that
    would then hold two rows of one method is refused (the two names scored the same needle)."""
    renamed = [{**r, "method": aliases.get(r["method"], r["method"])} for r in rows]
    keys = [row_key(r) for r in renamed]
    if len(set(keys)) < len(keys):
        raise SystemExit(f"--alias {aliases}: two of the aliased methods scored the same needle")
    return renamed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="lkv eval folders, FOLDER or FOLDER=NAME")
    parser.add_argument("--methods", nargs="+", default=None, help="default: every method in the rows")
    parser.add_argument("--reference", default="lookaheadkv")
    parser.add_argument("--budgets", nargs="+", default=["128", "256"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--alias", nargs="+", default=[], help="NEW=OLD: method OLD's rows read as NEW's")
    parser.add_argument(
        "--intervals", action="store_true", help="each paired difference's 95 %% interval (Newcombe, paired)"
    )
    args = parser.parse_args(argv)
    rows = aliased(merged(args.folders), dict(reversed(a.split("=", 1)) for a in args.alias))
    methods = args.methods or sorted({r["method"] for r in rows if r["method"] != "fullkv"})
    text = "\n".join(tables(rows, methods, args.reference, args.budgets, args.intervals))
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
