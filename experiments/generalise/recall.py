"""Held-out Recall@C of two recipes, paired by prompt: each named pair of methods (one pair per seed) gets the mean
of each, their difference and its paired-bootstrap 95 % interval and p, per budget.

    python experiments/generalise/recall.py FOLDER[@NAME] [MORE] --pair A=B [--pair ...]

FOLDERs are ``lkv eval`` folders of the ``importance`` task over the same label folder (configs/recall.yaml);
FOLDER@NAME appends ``@NAME`` to that folder's method names (the probe folders all name their method ``probe``).
Only prompts that both methods of a pair scored count.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lkv.eval.results import RESULTS_FILE, ResultsFile
from lkv.eval.stats import paired_bootstrap

TASK = "importance"


def recall_lines(rows: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Markdown lines: per pair and budget (the rows' ``recall@C`` metrics), n, both means, ``a − b`` [95 %], p."""
    recall = {
        (r["method"], r["sample"], key): value
        for r in rows
        if r["task"] == TASK
        for key, value in r["metrics"].items()
        if key.startswith("recall@")
    }
    if not recall:
        raise ValueError(f"no {TASK} row with a recall@C metric")
    keys = sorted({k for _, _, k in recall}, key=lambda k: int(k.split("@")[1]))
    lines = [
        "| metric | a | b | n | a | b | a − b [95 %] | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        for a, b in pairs:
            samples = sorted(s for m, s, k in recall if m == a and k == key and (b, s, k) in recall)
            if not samples:
                raise ValueError(f"no prompt that both {a!r} and {b!r} scored ({key})")
            first = [recall[(a, s, key)] for s in samples]
            second = [recall[(b, s, key)] for s in samples]
            test = paired_bootstrap(first, second)
            lines.append(
                f"| {key} | {a} | {b} | {test.n} | {sum(first) / len(first):.3f} | "
                f"{sum(second) / len(second):.3f} | {test.diff:+.3f} [{test.low:+.3f}, {test.high:+.3f}] | "
                f"{test.p:.2g} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="lkv eval folders of the importance task (FOLDER@NAME)")
    parser.add_argument(
        "--pair", action="append", required=True, metavar="A=B", help="methods to pair (repeat)"
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for given in args.folders:
        folder, _, name = given.partition("@")
        path = Path(folder) / RESULTS_FILE
        if not path.is_file():
            sys.exit(f"recall: no {RESULTS_FILE} in {folder}")
        suffix = f"@{name}" if name else ""
        rows += [{**r, "method": r["method"] + suffix} for r in ResultsFile(path).rows]
    pairs = [tuple(item.split("=", 1)) for item in args.pair]
    if any(len(p) != 2 or not all(p) for p in pairs):
        sys.exit(f"recall: --pair expects METHOD_A=METHOD_B, got {args.pair}")
    try:
        print("\n".join(recall_lines(rows, pairs)))
    except ValueError as error:
        sys.exit(f"recall: {error}")


if __name__ == "__main__":
    main()
