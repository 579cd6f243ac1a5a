"""FullKV-solved samples kept, and each LookaheadKV module against the strongest competitor, per setting and
task, for any ``lkv eval`` folders that scored the same samples.

    python experiments/reach/strongest.py FOLDER[=NAME] [FOLDER[=NAME] ...] --out FILE [--budgets 64 128 256 512]
        [--before METHOD] [--versus MODULE ...] [--by META_KEY] [--title TEXT]

Folders are merged row by row (a row found in several is taken from the first); their FullKV answers must be
the same text on every sample they share, or the script stops. ``FOLDER=NAME`` names that folder's trained
methods ``method:NAME`` (the lookahead modules' and the probe's), e.g. a second probe seed evaluated into a
folder of its own; its other rows (FullKV, Oracle, the training-free methods: the same whatever was trained,
often copied from another folder by ``copy_adapter_free``) keep their names. Per (setting, task): of the samples FullKV
answers fully, the share each method still answers fully (Wilson 95 %), and each LookaheadKV module against
the competitor with the highest kept share at each budget (no Oracle, FullKV or Quest), exact McNemar
(the tables of ``ruler.py``); with ``--before``, each other module against that one; with ``--versus``, each
named module against every other method (its lead or gap, with its 95 % interval). With several tasks, the
same tables once more over every task's pairs pooled. With ``--by KEY``, the tables of each task once more per
value of its rows' ``meta[KEY]`` (e.g. ``source_group``: in source / out of source), each on its own pairs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analyze import BUDGETS, read
from ruler import kept_tables

from lkv.eval.results import row_key
from lkv.eviction.roles import roles_of


def merged(folders: list[str]) -> list[dict[str, Any]]:
    """The rows of ``folders`` (``FOLDER`` or ``FOLDER=NAME``), each row key once (the first folder's row)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for spec in folders:
        folder, _, name = spec.partition("=")
        found = read(Path(folder))
        if not found:
            raise SystemExit(f"{folder}: no results.jsonl rows")
        for row in found:
            if name and roles_of(row["method"]).requires in ("adapter", "probe"):
                row = {**row, "method": f"{row['method']}:{name}"}
            key = row_key(row)
            if key in rows and row["method"] == "fullkv" and rows[key]["prediction"] != row["prediction"]:
                raise SystemExit(f"{folder}: FullKV answers {key} differently from an earlier folder")
            rows.setdefault(key, row)
    return list(rows.values())


def split_tables(
    rows: list[dict[str, Any]],
    key: str | None,
    title: str,
    budgets: tuple[str, ...],
    before: str | None,
    versus: tuple[str, ...],
) -> list[str]:
    """``kept_tables`` once per value of ``meta[key]`` among ``rows`` (none without ``key``, or with one value),
    each value's rows alone: its own FullKV-solved pairs and its own strongest competitor."""
    values = list(dict.fromkeys(r["meta"][key] for r in rows if key in r.get("meta", {}))) if key else []
    if len(values) < 2:
        return []
    lines: list[str] = []
    for value in values:
        part = [r for r in rows if r.get("meta", {}).get(key) == value]
        lines += [f"## {title}, {key} = {value}", "", *kept_tables(part, budgets, before, versus)]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="lkv eval folders, FOLDER or FOLDER=NAME")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budgets", nargs="+", default=list(BUDGETS))
    parser.add_argument("--before", help="the module the others are compared with (e.g. lookaheadkv)")
    parser.add_argument("--versus", nargs="+", default=[], help="modules set against every other method")
    parser.add_argument("--by", help="also per value of this meta key (e.g. source_group)")
    parser.add_argument("--title", default="FullKV-solved kept, and LookaheadKV vs the strongest competitor")
    args = parser.parse_args(argv)
    rows = merged(args.folders)
    budgets, versus = tuple(args.budgets), tuple(args.versus)
    lines = [f"# {args.title}", "", "Rows: " + ", ".join(f"`{f}`" for f in args.folders), ""]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for task in dict.fromkeys(r["task"] for r in rows if r["setting"] == setting):
            mine = [r for r in rows if r["setting"] == setting and r["task"] == task]
            lines += [f"## {task}, {setting}", "", *kept_tables(mine, budgets, args.before, versus)]
            lines += split_tables(mine, args.by, f"{task}, {setting}", budgets, args.before, versus)
        tasks = dict.fromkeys(r["task"] for r in rows if r["setting"] == setting)
        if len(tasks) > 1:  # the pairs of every task pooled (RULER's retention)
            mine = [r for r in rows if r["setting"] == setting]
            lines += [f"## every task, {setting}", "", *kept_tables(mine, budgets, args.before, versus)]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
