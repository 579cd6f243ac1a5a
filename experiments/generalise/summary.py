"""The generalisation signal of an ``lkv eval`` folder of the ``generalise`` task: per method and budget, the
FullKV-solved needles it kept, split by source group, source, kind side, kind and measured-distance bin.

    python experiments/generalise/summary.py reports/generalise/dev [MORE FOLDERS] [--setting aware]
        [--reference lookaheadkv] [--pair A=B ...] > table.md

*Solved* and *kept* are the paired comparisons' (:func:`lkv.eval.paired.fullkv_solved`): a needle counts only
where FullKV answered it, and a method keeps it when it answers it too; each share has its Wilson interval.
Several folders of the same needles (a later recipe evaluated beside the first run) are merged by sample: their
FullKV rows must agree on every shared sample (same prompt, same answer), and a method may sit in one folder only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lkv.eval.paired import fullkv_solved
from lkv.eval.results import FULL, RESULTS_FILE, ResultsFile, budget_order
from lkv.eval.stats import mcnemar_exact, wilson_interval
from lkv.eval.tasks.generalise import FAR, NEAR

TASK = "generalise"
# a grouping is one meta key or a tuple of them (their values joined: "out-of-source / far")
GROUPINGS: tuple[str | tuple[str, ...], ...] = (
    ("source_group", "bin"),
    "source_group",
    "source",
    "kind_side",
    "kind",
    "bin",
    "band",
)
# measured-distance bands (tokens from the end of the prompt) of the far bin, and the near / mid bins: "band" is
# computed from each row's meta["distance"]
BANDS: tuple[tuple[int, str], ...] = (
    (NEAR, "near ≤1K"),
    (FAR - 1, "mid 1–1.5K"),
    (2499, "1.5–2.5K"),
    (3999, "2.5–4K"),
)
LAST_BAND = "4–7.5K"
# the cells of --pair's tests: a grouping as in GROUPINGS, or None for every solved needle
PAIR_CELLS: tuple[str | tuple[str, ...] | None, ...] = (("source_group", "bin"), "bin", "kind_side", None)
# the default method every other is paired against, per (source group, bin) cell (exact McNemar)
REFERENCE = "lookaheadkv"


def merged_rows(folders: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several eval folders of the same needles as one list: each folder's FullKV rows must give the
    same score and prediction as the first folder's on every sample both hold (kept once), and each other method
    may come from one folder only (otherwise a needle would be counted twice)."""
    merged: list[dict[str, Any]] = []
    full: dict[tuple[str, str, str], tuple[int, dict[str, Any]]] = {}
    owner: dict[str, int] = {}
    for index, rows in enumerate(folders, start=1):
        for r in rows:
            if r["budget"] == FULL:
                first_index, first = full.setdefault((r["task"], r["setting"], r["sample"]), (index, r))
                if (first["score"], first.get("prediction")) != (r["score"], r.get("prediction")):
                    raise ValueError(
                        f"folder {index}: FullKV's row for sample {r['sample']!r} differs from folder "
                        f"{first_index}'s: not the same needles, or not the same model"
                    )
                if first_index != index:
                    continue
            elif owner.setdefault(r["method"], index) != index:
                raise ValueError(
                    f"method {r['method']!r} has rows in folders {owner[r['method']]} and {index}"
                )
            merged.append(r)
    return merged


def renamed(rows: Sequence[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """``rows`` with ``@name`` appended to every method but FullKV's (unchanged when ``name`` is empty)."""
    if not name:
        return list(rows)
    return [r if r["budget"] == FULL else {**r, "method": f"{r['method']}@{name}"} for r in rows]


def folder_rows(given: str, script: str) -> list[dict[str, Any]]:
    """The rows of ``FOLDER[@NAME]`` (an eval folder or its ``results.jsonl``), renamed by ``@NAME``; exits with
    one ``script: ...`` line when there is no results file."""
    folder, _, name = given.partition("@")
    path = Path(folder) / RESULTS_FILE if Path(folder).is_dir() else Path(folder)
    if not path.is_file():
        sys.exit(f"{script}: no {RESULTS_FILE} at {path}")
    return renamed(ResultsFile(path).rows, name)


def kept_tables(
    rows: Sequence[dict[str, Any]], setting: str = "aware", reference: str = REFERENCE
) -> list[str]:
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
    return lines + paired_lines(scores, meta, solved, columns, reference)


def paired_lines(
    scores: dict[tuple[str, str, str], float],
    meta: dict[str, dict[str, Any]],
    solved: set[str],
    columns: list[tuple[str, str]],
    reference: str = REFERENCE,
) -> list[str]:
    """Markdown lines: per (source group × bin) cell and budget, every method against ``reference`` on the
    needles both have rows for: the difference in kept share, wins / losses of the reference, exact McNemar p."""
    grouping = ("source_group", "bin")
    lines = [
        f"Paired against {reference} (same needles): difference in points (other − {reference}), "
        f"{reference}'s wins / losses, exact McNemar p.",
        "",
        "| source_group × bin | C | method | n | difference | wins / losses | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for value in sorted({_value(meta[s], grouping) for s in solved}):
        samples = [s for s in solved if _value(meta[s], grouping) == value]
        for method, budget in columns:
            if method == reference:
                continue
            pairs = [
                (scores[(reference, budget, s)], scores[(method, budget, s)])
                for s in samples
                if (reference, budget, s) in scores and (method, budget, s) in scores
            ]
            if not pairs:
                continue
            test = mcnemar_exact([float(b == 1.0) for _, b in pairs], [float(a == 1.0) for a, _ in pairs])
            lines.append(
                f"| {value} | {budget} | {method} | {test.n} | {100 * test.diff:+.0f} | "
                f"{test.losses} / {test.wins} | {test.p:.2g} |"
            )
    return lines


def pair_lines(
    scores: dict[tuple[str, str, str], float],
    meta: dict[str, dict[str, Any]],
    solved: set[str],
    pairs: Sequence[tuple[str, str]],
    budgets: Sequence[str],
) -> list[str]:
    """Markdown lines: each named pair ``(a, b)`` of methods per cell of :data:`PAIR_CELLS` and budget, on the
    needles both have rows for: how many each keeps, the difference ``a − b`` in points with its 95 % interval,
    ``a``'s wins / losses and the exact McNemar p. The per-seed comparisons of a recipe name one pair per seed,
    so no test pools two seeds' rows."""
    lines = [
        "Named pairs (same needles): a − b in points [95 %], a's wins / losses, exact McNemar p.",
        "",
        "| cell | C | a | b | n | a kept | b kept | a − b [95 %] | wins / losses | p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for grouping in PAIR_CELLS:
        values = sorted({_value(meta[s], grouping) for s in solved}) if grouping else ["all"]
        for value in values:
            samples = sorted(s for s in solved if grouping is None or _value(meta[s], grouping) == value)
            for budget in budgets:
                for a, b in pairs:
                    both = [s for s in samples if (a, budget, s) in scores and (b, budget, s) in scores]
                    if not both:
                        continue
                    first = [float(scores[(a, budget, s)] == 1.0) for s in both]
                    second = [float(scores[(b, budget, s)] == 1.0) for s in both]
                    test = mcnemar_exact(first, second)
                    lines.append(
                        f"| {value} | {budget} | {a} | {b} | {test.n} | {sum(first):.0f} | {sum(second):.0f} | "
                        f"{100 * test.diff:+.0f} [{100 * test.low:+.0f}, {100 * test.high:+.0f}] | "
                        f"{test.wins} / {test.losses} | {test.p:.2g} |"
                    )
    return lines


def distance_band(distance: int) -> str:
    """The band of :data:`BANDS` a measured distance (tokens) falls in."""
    return next((name for top, name in BANDS if distance <= top), LAST_BAND)


def preset_figures(
    rows: Sequence[dict[str, Any]], methods: dict[int, str], preset: str, setting: str = "aware"
) -> list[dict[str, Any]]:
    """One object per seed (``methods``: seed → the method name of that seed's preset) of counts of FullKV-solved
    needles: per source group, far and near ``n``, how many the preset kept at C = 128 / 256 (near: 128), and how
    many the Oracle kept at C = 128. A needle counts only where the seed's method has a row at every budget (a
    run that evaluated part of the needles counts that part)."""
    solved = fullkv_solved(rows, TASK, setting)
    meta = {r["sample"]: r["meta"] for r in rows if r["task"] == TASK and r["sample"] in solved}
    mine = [r for r in rows if r["task"] == TASK and r["setting"] == setting and r["sample"] in solved]
    kept = {(r["method"], r["budget"], r["sample"]) for r in mine if r["score"] == 1.0}
    present = {(r["method"], r["budget"], r["sample"]) for r in mine}

    def count(method: str, budget: str, samples: list[str]) -> int:
        return sum((method, budget, s) in kept for s in samples)

    def group(method: str, source_group: str) -> dict[str, int]:
        cell = {
            b: [
                s
                for s in sorted(solved)
                if meta[s]["source_group"] == source_group
                and meta[s]["bin"] == b
                and all((method, budget, s) in present for budget in ("128", "256"))
            ]
            for b in ("far", "near")
        }
        return {
            "far_n": len(cell["far"]),
            "far_kept_128": count(method, "128", cell["far"]),
            "far_kept_256": count(method, "256", cell["far"]),
            "near_n": len(cell["near"]),
            "near_kept_128": count(method, "128", cell["near"]),
            "oracle_far_kept_128": count("oracle", "128", cell["far"]),
        }

    return [
        {
            "seed": seed,
            "preset": preset,
            "method": method,
            "out_of_source": group(method, "out-of-source"),
            "in_source": group(method, "in-source"),
        }
        for seed, method in sorted(methods.items())
    ]


def named_pairs(rows: Sequence[dict[str, Any]], setting: str, given: Sequence[str]) -> list[str]:
    """:func:`pair_lines` for ``A=B`` strings, over every budget the rows evaluate."""
    pairs = [tuple(item.split("=", 1)) for item in given]
    if any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise ValueError(f"--pair: expected METHOD_A=METHOD_B, got {list(given)}")
    solved = fullkv_solved(rows, TASK, setting)
    mine = [r for r in rows if r["task"] == TASK and r["setting"] == setting and r["budget"] != FULL]
    methods = {r["method"] for r in mine}
    unknown = sorted({m for pair in pairs for m in pair} - methods)
    if unknown:
        raise ValueError(f"--pair: no rows of method(s) {unknown}; the rows hold {sorted(methods)}")
    meta = {r["sample"]: r["meta"] for r in rows if r["task"] == TASK and r["sample"] in solved}
    scores = {(r["method"], r["budget"], r["sample"]): r["score"] for r in mine}
    budgets = sorted({r["budget"] for r in mine}, key=budget_order)
    return pair_lines(scores, meta, solved, pairs, budgets)


def _value(meta: dict[str, Any], grouping: str | tuple[str, ...]) -> str:
    keys = grouping if isinstance(grouping, tuple) else (grouping,)
    return " / ".join(distance_band(meta["distance"]) if key == "band" else str(meta[key]) for key in keys)


def _cell(scores: dict[tuple[str, str, str], float], method: str, budget: str, samples: list[str]) -> str:
    run = [scores[(method, budget, s)] for s in samples if (method, budget, s) in scores]
    if not run:
        return "–"
    kept = sum(score == 1.0 for score in run)
    low, high = wilson_interval(kept, len(run))
    return f"{kept}/{len(run)} = {100 * kept / len(run):.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folders",
        nargs="+",
        help="lkv eval output folders (or their results.jsonl) of the same needles; FOLDER@NAME appends @NAME to "
        "that folder's method names (two seeds' folders that name their methods alike)",
    )
    parser.add_argument("--setting", default="aware", choices=("aware", "agnostic"))
    parser.add_argument("--reference", default=REFERENCE, help="the method every other is paired against")
    parser.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="A=B",
        help="also test method A against method B per cell (repeat; e.g. one pair per seed)",
    )
    parser.add_argument(
        "--json", type=Path, help="also write the preset's per-seed counts (preset_figures) to this file"
    )
    parser.add_argument("--preset", default="general", help="the preset's name in --json")
    parser.add_argument(
        "--seed_method",
        action="append",
        default=[],
        metavar="SEED=METHOD",
        help="a seed of the preset and its method name in the rows (repeat per seed), for --json",
    )
    args = parser.parse_args(argv)
    folders = []
    for given in args.folders:
        folders.append(folder_rows(given, "summary"))
    try:
        rows = merged_rows(folders)
        lines = kept_tables(rows, args.setting, args.reference)
        if args.pair:
            lines += ["", *named_pairs(rows, args.setting, args.pair)]
        print("\n".join(lines))
        if args.json is not None:
            methods = {
                int(seed): method for seed, method in (item.split("=", 1) for item in args.seed_method)
            }
            if not methods:
                raise ValueError("--json needs at least one --seed_method SEED=METHOD")
            figures = preset_figures(rows, methods, args.preset, args.setting)
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    except ValueError as error:
        sys.exit(f"summary: {error}")


if __name__ == "__main__":
    main()
