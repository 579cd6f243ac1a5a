"""NVIDIA kvpress's leaderboard table from ``lkv eval`` folders of configs/eval/kvpress_protocol.yaml.

kvpress reports one number per (press, compression ratio): the RULER score, the mean over tasks of each task's
``string_match`` on the 0–100 scale, question-agnostic, the ratio being the share of the KV cache *removed*.
:func:`kvpress_table` gives that table, rows ``press`` (the folder run with ``head_budget: equal``) and
``adakv_press`` (an optional second folder run with ``head_budget: adaptive``), plus lkv's additions per cell:
the sample count ``n``, a 95 % interval (stratified bootstrap over the tasks' samples,
:func:`lkv.eval.stats.stratified_bootstrap_interval`) and the paired test against a reference method
(default: agnostic LookaheadKV, ``lookaheadkv:agnostic``) on the same (task, sample) pairs at the same ratio:
exact McNemar where both sides score 0/1, paired bootstrap otherwise (multi-value RULER tasks give fractions).
Tasks FullKV scores 0 on measure the model, not the eviction: they are left out of every average and listed.
``--min_solved SHARE`` leaves out, the same way, every task on which FullKV answers fewer than ``SHARE`` of the
samples fully (score 1): kvpress's protocol on a small model, run on the tasks it solves (a rule that reads
FullKV's rows only, so it is fixed before any compressed row); ``no_press`` then averages the same tasks.

    python -m lkv.eval.kvpress_table reports/eval/kvpress_protocol [reports/eval/kvpress_protocol_adakv] \
        [--min_solved 0.5]

prints the markdown and writes it to ``kvpress_table.md`` in the first folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lkv.core.budget import Budget
from lkv.eval.paired import pair_by_sample
from lkv.eval.results import (
    ADDED_KEYS,
    FULL,
    NO_BUDGET,
    RESULTS_FILE,
    RUN_FILE,
    ResultsFile,
    parse_budget_key,
)
from lkv.eval.stats import PairedResult, stratified_bootstrap_interval
from lkv.eviction.roles import REFERENCE

TABLE_FILE = "kvpress_table.md"
SETTING = "agnostic"  # kvpress's leaderboard compresses the context before the question is seen
DEFAULT_REFERENCE = "lookaheadkv:agnostic"
NO_PRESS = "no_press"  # kvpress's name of the uncompressed run (compression ratio 0)
#: lkv method → kvpress's press name where they differ (the rest are spelled alike)
KVPRESS_NAMES = {REFERENCE: NO_PRESS, "streamingllm": "streaming_llm", "restorekv": "RestoreKV"}
#: the ``head_budget`` each folder must have been run with, and the prefix of its rows
FOLDER_KINDS = (("equal", ""), ("adaptive", "adakv_"))


def compression_ratio(budget: Budget) -> float:
    """kvpress's compression ratio (share of the cache removed) of an lkv ratio budget (share kept):
    ``0.75 → 0.25``, ``0.125 → 0.875``; exact for kvpress's four ratios (all dyadic fractions)."""
    if not budget.is_ratio or budget.value == 1.0:
        raise ValueError(
            f"budget {budget} is not a ratio in (0, 1) of the prompt kept; kvpress's table needs ratio budgets "
            "(configs/eval/kvpress_protocol.yaml)"
        )
    return round(1.0 - float(budget.value), 12)


@dataclass(frozen=True)
class Cell:
    """One (row, ratio) of the table: ``score`` the mean over tasks of each task's mean × 100, ``n`` the
    (task, sample) pairs behind it, ``low``..``high`` its 95 % interval × 100, ``paired`` the test against the
    reference (None for the reference itself, FullKV, or where the reference has no rows), ``missing`` the
    averaged tasks this cell has no rows of (an unfinished run: its mean is over the others)."""

    score: float
    n: int
    low: float
    high: float
    paired: PairedResult | None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class KvpressTable:
    """The table: ``rows`` is press name → {compression ratio → :class:`Cell`} (``no_press`` at ratio 0),
    ``tasks`` the averaged tasks, ``fullkv_zero`` the tasks left out (FullKV scores 0 on them), ``reference``
    the method every cell is paired against, ``unsolved`` the other tasks left out (task → FullKV's fully
    answered and all samples) and ``min_solved`` the share of samples that rule asked for."""

    rows: dict[str, dict[float, Cell]]
    tasks: list[str]
    fullkv_zero: list[str]
    reference: str
    unsolved: dict[str, tuple[int, int]] = field(default_factory=dict)
    min_solved: float = 0.0

    def markdown(self) -> str:
        """kvpress's table (scores only), then the same cells with lkv's additions, then the left-out tasks."""
        paired = any(c.paired for cells in self.rows.values() for c in cells.values())
        missing = "" if paired else f" (the first folder has no {self.reference} rows: no paired tests here)"
        zero = ", ".join(self.fullkv_zero) if self.fullkv_zero else "none"
        unsolved = ", ".join(f"{task} ({k}/{n})" for task, (k, n) in self.unsolved.items())
        share = f"{100 * self.min_solved:g} %"
        below = (
            [f"FullKV answers fewer than {share} of the samples fully (left out too): {unsolved}.", ""]
            if self.unsolved
            else []
        )
        return "\n".join(
            [
                "## kvpress's protocol: RULER, question-agnostic",
                "",
                "RULER score: the mean over tasks of string_match × 100; columns: compression ratio (share of the "
                "KV cache removed; lkv budget = 1 − ratio kept); rows `adakv_*`: head_budget adaptive. Tasks: "
                f"{', '.join(self.tasks)}.",
                "",
                *self._table(_score),
                "",
                f"lkv's additions: score [95 % interval] (n); paired against {self.reference} on the same "
                "samples: difference in points (wins/losses) and p (exact McNemar for 0/1 scores, paired "
                f"bootstrap otherwise; **bold**: p < 0.05){missing}.",
                "",
                *self._table(_detail),
                "",
                f"FullKV = 0 (left out of every average above): {zero}.",
                "",
                *below,
            ]
        )

    def _table(self, render: Callable[[Cell | None], str]) -> list[str]:
        """Markdown lines of a press × compression ratio table, each cell written by ``render``."""
        ratios = sorted({r for cells in self.rows.values() for r in cells})
        lines = ["| press | " + " | ".join(f"{r:g}" for r in ratios) + " |", "|---|" + "---:|" * len(ratios)]
        return lines + [
            f"| {name} | " + " | ".join(render(cells.get(r)) for r in ratios) + " |"
            for name, cells in self.rows.items()
        ]


def _score(cell: Cell | None) -> str:
    """kvpress's cell: the score; ``*`` marks a mean over fewer tasks (the details name them)."""
    return "–" if cell is None else f"{cell.score:.1f}" + ("*" if cell.missing else "")


def _detail(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    text = f"{cell.score:.1f} [{cell.low:.1f}, {cell.high:.1f}] ({cell.n})"
    if cell.missing:
        text += f", without {', '.join(cell.missing)}"
    test = cell.paired
    if test is None:
        return text
    versus = f"{100 * test.diff:+.1f} ({test.wins}/{test.losses}) p={test.p:.2g}"
    return f"{text}; {'**' + versus + '**' if test.significant else versus}"


def read_folder(folder: Path, head_budget: str) -> list[dict[str, Any]]:
    """The question-agnostic end-task rows of an ``lkv eval`` folder run with ``head_budget``.

    Raises:
        ValueError: the folder has no rows or ``run.json``, was run with another ``head_budget``, or holds
            no question-agnostic rows.
    """
    results, run = folder / RESULTS_FILE, folder / RUN_FILE
    if not results.is_file() or not run.is_file():
        raise ValueError(f"{folder}: no {RESULTS_FILE} and {RUN_FILE}; expected an lkv eval output folder")
    used = json.loads(run.read_text()).get("head_budget", ADDED_KEYS["head_budget"])
    if used != head_budget:
        raise ValueError(f"{folder}/{RUN_FILE}: head_budget is {used!r}, expected {head_budget!r}")
    rows = [r for r in ResultsFile(results).rows if r["setting"] == SETTING and r["budget"] != NO_BUDGET]
    if not rows:
        raise ValueError(
            f"{folder}/{RESULTS_FILE}: no question-agnostic end-task rows (settings: [{SETTING}])"
        )
    return rows


def kvpress_table(
    folders: Sequence[Sequence[dict[str, Any]]],
    reference: str = DEFAULT_REFERENCE,
    seed: int = 0,
    min_solved: float = 0.0,
) -> KvpressTable:
    """kvpress's table of the rows of one folder (equal budgets) or two (equal, then adaptive), averaged over
    the tasks FullKV scores above 0 on, and answers at least ``min_solved`` of the samples fully on.

    The FullKV = 0 tasks, the unsolved ones and the reference's scores come from the first folder; FullKV's
    rows of the adaptive folder (the same answers) are not repeated. Rows are each method in run order, its
    ``adakv_`` row after it.

    Raises:
        ValueError: more than two folders, a first folder without FullKV rows, a budget that is no ratio, or
            ``min_solved`` outside [0, 1].
    """
    if not 0.0 <= min_solved <= 1.0:
        raise ValueError(f"min_solved is a share of a task's samples in [0, 1], got {min_solved}")
    if not 1 <= len(folders) <= len(FOLDER_KINDS):
        raise ValueError(
            f"expected one or two folders (equal, then adaptive head budgets), got {len(folders)}"
        )
    # (prefix, method, budget key) → {"task/sample": score}
    cells: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for (_, prefix), rows in zip(FOLDER_KINDS, folders, strict=False):
        for row in rows:
            cells[(prefix, row["method"], row["budget"])][f"{row['task']}/{row['sample']}"] = row["score"]
    full = cells.get(("", REFERENCE, FULL))
    if not full:
        raise ValueError(f"the first folder has no {REFERENCE} rows: kvpress's table needs them ({NO_PRESS})")
    by_task: dict[str, list[float]] = defaultdict(list)
    for key, score in full.items():
        by_task[key.split("/", 1)[0]].append(score)
    zero = sorted(task for task, scores in by_task.items() if not any(scores))
    solved = {task: (sum(score == 1.0 for score in scores), len(scores)) for task, scores in by_task.items()}
    unsolved = {t: kn for t, kn in solved.items() if t not in zero and kn[0] < min_solved * kn[1]}
    tasks = [task for task in by_task if task not in zero and task not in unsolved]
    methods = list(dict.fromkeys(method for _, method, _ in cells))
    table: dict[str, dict[float, Cell]] = {}
    for method in methods:
        for _, prefix in FOLDER_KINDS:
            if prefix and method == REFERENCE:
                continue
            found = {b: s for (p, m, b), s in cells.items() if (p, m) == (prefix, method)}
            if not found:
                continue
            row: dict[float, Cell] = {}
            for budget, scores in found.items():
                ratio = 0.0 if budget == FULL else compression_ratio(parse_budget_key(budget))
                own = cells.get(("", reference, budget), {}) if (prefix, method) != ("", reference) else {}
                try:
                    row[ratio] = _cell(scores, tasks, own, seed)
                except ValueError as error:
                    raise ValueError(f"{prefix}{method} at budget {budget}: {error}") from None
            name = prefix + KVPRESS_NAMES.get(method, method)
            table[name] = dict(sorted(row.items()))
    return KvpressTable(table, tasks, zero, reference, unsolved, min_solved)


def _cell(scores: dict[str, float], tasks: list[str], reference: dict[str, float], seed: int) -> Cell:
    """A cell from {"task/sample": score}, over ``tasks`` only, paired with ``reference`` where it has rows."""
    kept = {key: score for key, score in scores.items() if key.split("/", 1)[0] in tasks}
    by_task = {task: [s for k, s in kept.items() if k.split("/", 1)[0] == task] for task in tasks}
    groups = [g for g in by_task.values() if g]
    if not groups:
        raise ValueError(f"no scores on the tasks FullKV solves ({', '.join(tasks) or 'none'})")
    low, high = stratified_bootstrap_interval(groups, seed=seed)
    score = sum(sum(g) / len(g) for g in groups) / len(groups)
    paired = pair_by_sample(kept, reference, seed) if reference else None
    missing = tuple(task for task, g in by_task.items() if not g)
    return Cell(100 * score, len(kept), 100 * low, 100 * high, paired, missing)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lkv.eval.kvpress_table FOLDER [ADAKV_FOLDER] [--reference METHOD]``."""
    parser = argparse.ArgumentParser(
        prog="python -m lkv.eval.kvpress_table", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "folders", nargs="+", type=Path, help="lkv eval folders: equal, then adaptive budgets"
    )
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, help="method every cell is paired against")
    parser.add_argument(
        "--min_solved",
        type=float,
        default=0.0,
        help="also leave out each task on which FullKV answers fewer than this share of the samples fully",
    )
    args = parser.parse_args(argv)
    if len(args.folders) > len(FOLDER_KINDS):
        parser.error(
            f"expected one or two folders (equal, then adaptive head budgets), got {len(args.folders)}"
        )
    try:
        rows = [read_folder(f, kind) for (kind, _), f in zip(FOLDER_KINDS, args.folders, strict=False)]
        text = kvpress_table(rows, args.reference, min_solved=args.min_solved).markdown()
    except ValueError as error:
        sys.exit(f"kvpress_table: {error}")
    print(text)
    (args.folders[0] / TABLE_FILE).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
