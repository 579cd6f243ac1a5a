"""TensorBoard event files of `lkv eval`: one run per method (the summaries themselves: :mod:`lkv.core.tensorboard`).

Eval runs (:func:`write_eval_runs`), one run per method so that TensorBoard overlays the methods on each
card::

    <log_dir>/<method>/   tags <task>/<setting>/<metric>          step = budget C (KV entries kept per head)
                          tags <task>/<setting>/<metric>_ratio    step = ratio budget × 1000
                          tags interval/<task>/<setting>/score/{low,high}   95 % interval of the cell's score
                          tags <task>/recall    (importance rows)  step = C of Recall@C
                          the custom_scalars layout: one category per task, a margin chart (score with its
                          interval) or a line chart per setting and metric

FullKV has no budget: it is written at every budget of its task and setting, a flat reference line. The
folder is rebuilt whole and swapped in, so a report regenerated from the same results leaves exactly one
point per (run, tag, step).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.tensorboard.summary import custom_scalars
from torch.utils.tensorboard.writer import FileWriter

from lkv.core.tensorboard import scalar
from lkv.eval.results import FULL, NO_BUDGET, budget_order, parse_budget_key

# Keys of a summary cell that are not metrics.
CELL_KEYS = ("task", "setting", "method", "budget", "n", "ci_low", "ci_high")
TOKENS_NOTE = (
    "Step = budget C (KV entries kept per head). FullKV keeps the whole cache and is drawn at every budget "
    "as a flat reference line."
)
RATIO_NOTE = (
    "Step = budget as a ratio of the prompt × 1000 (250 = a quarter of the prompt's KV entries kept). "
    "FullKV is drawn at every budget as a flat reference line."
)


def _budget_axis(key: str) -> tuple[str, int]:
    """Tag suffix and step of a row's budget column: tokens as they are, ratios in thousandths of the prompt."""
    budget = parse_budget_key(key)
    return ("_ratio", round(1000 * budget.value)) if budget.is_ratio else ("", budget.value)


def _metrics(cell: Mapping[str, Any]) -> list[str]:
    return [k for k, v in cell.items() if k not in CELL_KEYS and isinstance(v, int | float)]


def eval_points(summary: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[str, int, float, str]]]:
    """The points of :func:`write_eval_runs`: method → ``(tag, step, value, description)``.

    Args:
        summary: cells of :func:`lkv.eval.report.summarize` (one per task, setting, method and budget), each
            with ``score`` and its metrics; with ``ci_low`` and ``ci_high`` (same scale as ``score``) when
            the cell's interval is known.
    """
    budgets: dict[tuple[str, str], set[str]] = {}
    for cell in summary:
        if cell["budget"] not in (FULL, NO_BUDGET):
            budgets.setdefault((cell["task"], cell["setting"]), set()).add(cell["budget"])
    points: dict[str, list[tuple[str, int, float, str]]] = {}
    for cell in summary:
        out = points.setdefault(cell["method"], [])
        task, setting = cell["task"], cell["setting"]
        if cell["budget"] == NO_BUDGET:  # importance: Recall@C over C, Kendall τ on its own
            note = f"Ranking of {task} scores against the ground truth; step = budget C of Recall@C."
            for name in _metrics(cell):
                if name.startswith("recall@"):
                    out.append((f"{task}/recall", int(name.split("@", 1)[1]), cell[name], note))
                elif name == "kendall_tau":
                    out.append(
                        (f"{task}/kendall_tau", 0, cell[name], "Kendall τ-b against the ground truth.")
                    )
            continue
        shown = budgets.get((task, setting), set()) if cell["budget"] == FULL else {cell["budget"]}
        for budget in sorted(shown, key=budget_order):
            suffix, step = _budget_axis(budget)
            note = TOKENS_NOTE if not suffix else RATIO_NOTE
            for name in _metrics(cell):
                out.append((f"{task}/{setting}/{name}{suffix}", step, cell[name], note))
            if "ci_low" in cell and "ci_high" in cell:
                interval = f"95 % interval of {task}/{setting}/score{suffix} over the cell's samples. {note}"
                for bound in ("low", "high"):
                    tag = f"interval/{task}/{setting}/score{suffix}/{bound}"
                    out.append((tag, step, cell[f"ci_{bound}"], interval))
    return points


def eval_layout(points: Mapping[str, Sequence[tuple[str, int, float, str]]]) -> dict[str, dict[str, list]]:
    """The custom_scalars layout of :func:`eval_points`: a category per task; per setting and metric a
    margin chart (score between its interval bounds) when the interval was logged, else a line chart."""
    tags = sorted({tag for rows in points.values() for tag, *_ in rows})
    layout: dict[str, dict[str, list]] = {}
    for tag in tags:
        if tag.startswith("interval/"):
            continue
        task, _, rest = tag.partition("/")
        chart = layout.setdefault(f"{task} (step = budget)", {})
        low = f"interval/{tag}/low"
        if low in tags:
            chart[rest] = ["Margin", [tag, low, f"interval/{tag}/high"]]
        else:
            chart[rest] = ["Multiline", [f"^{re.escape(tag)}$"]]
    return layout


def write_eval_runs(summary: Sequence[Mapping[str, Any]], log_dir: str | Path) -> list[Path]:
    """One TensorBoard run per method in ``log_dir`` (see the module docstring); returns the run folders.

    The runs are written into a hidden folder beside ``log_dir`` and swapped in for the old one, so runs of
    methods no longer in ``summary`` disappear and nothing is appended to earlier event files.
    """
    log_dir = Path(log_dir)
    points = eval_points(summary)
    layout = custom_scalars(eval_layout(points))
    staging = log_dir.with_name(f".{log_dir.name}.{os.getpid()}.new")
    shutil.rmtree(staging, ignore_errors=True)
    for method, rows in points.items():
        writer = FileWriter(str(staging / method))
        try:
            writer.add_summary(layout, 0)
            for tag, step, value, description in rows:
                if not math.isnan(value):
                    writer.add_summary(scalar(tag, value, description), step)
        finally:
            writer.close()
    staging.mkdir(parents=True, exist_ok=True)  # an empty summary still replaces the old runs
    old = log_dir.with_name(f".{log_dir.name}.{os.getpid()}.old")
    if log_dir.exists():
        log_dir.rename(old)
    staging.rename(log_dir)
    shutil.rmtree(old, ignore_errors=True)
    return [log_dir / method for method in points]
