"""Reports of ``lkv eval`` results: summary CSV, markdown tables, PNG plots and TensorBoard runs.

``write_report(rows, folder)`` turns the rows of ``results.jsonl`` into::

    summary.csv                    mean of every metric per (task, setting, method, budget), with counts
    report.md                      one table per task and setting (methods × budgets, main metric × 100),
                                   the importance table, links to the plots
    plots/<task>_<setting>.png     main metric vs budget, one line per method (FullKV dashed)
    plots/niah_heatmap_<setting>.png   needle depth × context length, one panel per method and budget
    tensorboard/eval/<method>/     one run per method, tags ``<task>/<setting>/<metric>`` with the budget
                                   as the step (see :mod:`lkv.eval.tensorboard`)
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from lkv.eval.tensorboard import FULL, NO_BUDGET, write_eval_runs

SETTING_NAMES = {"aware": "question-aware", "agnostic": "question-agnostic"}


def _budget_sort_key(budget: str) -> tuple[int, float]:
    if budget == FULL:
        return (1, 0.0)
    if budget == NO_BUDGET:
        return (2, 0.0)
    return (0, float(budget))


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means of ``score`` and every metric per (task, setting, method, budget), with the sample count ``n``."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["setting"], row["method"], row["budget"])].append(row)
    summary = []
    for (task, setting, method, budget), members in groups.items():
        entry: dict[str, Any] = {
            "task": task,
            "setting": setting,
            "method": method,
            "budget": budget,
            "n": len(members),
            "score": sum(r["score"] for r in members) / len(members),
        }
        names = dict.fromkeys(k for r in members for k in r["metrics"])
        for name in names:
            values = [r["metrics"][name] for r in members if name in r["metrics"]]
            entry[name] = sum(values) / len(values)
        summary.append(entry)
    # Tasks in the order they were run, then settings (aware first), methods by name, budgets ascending.
    task_order = {task: i for i, task in enumerate(dict.fromkeys(task for task, _, _, _ in groups))}
    settings = list(SETTING_NAMES)
    summary.sort(
        key=lambda e: (
            task_order[e["task"]],
            settings.index(e["setting"]) if e["setting"] in settings else len(settings),
            e["method"],
            _budget_sort_key(e["budget"]),
        )
    )
    return summary


def write_csv(summary: Sequence[dict[str, Any]], path: Path) -> None:
    """One line per summary entry; metric columns are the union over entries (empty where absent)."""
    columns = list(dict.fromkeys(k for entry in summary for k in entry))
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        for entry in summary:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in entry.items()})


def _order(items: Iterable[str], preferred: Sequence[str]) -> list[str]:
    found = list(dict.fromkeys(items))
    return [m for m in preferred if m in found] + [m for m in found if m not in preferred]


def markdown_tables(summary: Sequence[dict[str, Any]], methods: Sequence[str] = ()) -> str:
    """Markdown: per task and setting, methods × budgets of the main score × 100; importance separately."""
    lines: list[str] = []
    tasks = list(dict.fromkeys(e["task"] for e in summary))
    for task in tasks:
        entries = [e for e in summary if e["task"] == task]
        if all(e["budget"] == NO_BUDGET for e in entries):
            lines += _importance_table(task, entries, methods)
            continue
        for setting in _order((e["setting"] for e in entries), list(SETTING_NAMES)):
            chosen = [e for e in entries if e["setting"] == setting]
            budgets = sorted({e["budget"] for e in chosen if e["budget"] != FULL}, key=_budget_sort_key)
            cell = {(e["method"], e["budget"]): e for e in chosen}
            n = max(e["n"] for e in chosen)
            lines += [
                f"**{task}**, {SETTING_NAMES.get(setting, setting)} (score × 100, n = {n} per cell)",
                "",
            ]
            lines.append("| method | " + " | ".join(f"C={b}" for b in budgets) + " |")
            lines.append("|---|" + "---:|" * len(budgets))
            for method in _order((e["method"] for e in chosen), methods):
                if (method, FULL) in cell:
                    values = [cell[(method, FULL)]["score"]] * len(budgets)
                else:
                    values = [
                        cell[(method, b)]["score"] if (method, b) in cell else math.nan for b in budgets
                    ]
                lines.append(f"| {method} | " + " | ".join(_pct(v) for v in values) + " |")
            lines.append("")
    return "\n".join(lines)


def _importance_table(task: str, entries: list[dict[str, Any]], methods: Sequence[str]) -> list[str]:
    metrics = [k for k in entries[0] if k.startswith("recall@")] + ["kendall_tau"]
    lines = [
        f"**{task}**: ranking of each method's scores vs the ground truth of held-out labels "
        f"(n = {max(e['n'] for e in entries)} prompts; mean over layers and KV heads)",
        "",
        "| method | " + " | ".join(metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    by_method = {e["method"]: e for e in entries}
    for method in _order(by_method, methods):
        lines.append(f"| {method} | " + " | ".join(f"{by_method[method][m]:.3f}" for m in metrics) + " |")
    return [*lines, ""]


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}"


def plot_budget_curves(
    summary: Sequence[dict[str, Any]], folder: Path, methods: Sequence[str] = ()
) -> list[Path]:
    """One PNG per (task, setting): main score vs budget, a line per method, FullKV as a dashed level."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    keys = dict.fromkeys((e["task"], e["setting"]) for e in summary if e["budget"] != NO_BUDGET)
    for task, setting in keys:
        chosen = [e for e in summary if (e["task"], e["setting"]) == (task, setting)]
        fig = Figure(figsize=(7.5, 4), layout="constrained")
        ax = fig.add_subplot()
        budgets = sorted({float(e["budget"]) for e in chosen if e["budget"] != FULL})
        for method in _order((e["method"] for e in chosen), methods):
            points = sorted(
                (float(e["budget"]), e["score"])
                for e in chosen
                if e["method"] == method and e["budget"] != FULL
            )
            full = [e["score"] for e in chosen if e["method"] == method and e["budget"] == FULL]
            if full:
                ax.axhline(100 * full[0], color="black", linestyle="--", linewidth=1, label=method)
            elif points:
                ax.plot([b for b, _ in points], [100 * s for _, s in points], marker="o", label=method)
        if budgets and all(b >= 1 for b in budgets):
            ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
        ax.set_xlabel("budget C (KV entries kept per head)")
        ax.set_ylabel("score × 100")
        ax.set_title(f"{task}, {SETTING_NAMES.get(setting, setting)}")
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
        path = folder / f"{_slug(task)}_{setting}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def plot_niah_heatmaps(
    rows: Sequence[dict[str, Any]], folder: Path, methods: Sequence[str] = ()
) -> list[Path]:
    """Per setting, a grid of needle-depth × context-length heat maps: a row per method, a column per budget
    (FullKV, which has no budget, in the first column)."""
    folder.mkdir(parents=True, exist_ok=True)
    needle = [r for r in rows if r["task"] == "niah" and "depth" in r["meta"] and "length" in r["meta"]]
    paths = []
    for setting in _order((r["setting"] for r in needle), list(SETTING_NAMES)):
        chosen = [r for r in needle if r["setting"] == setting]
        lengths = sorted({r["meta"]["length"] for r in chosen})
        depths = sorted({r["meta"]["depth"] for r in chosen})
        budgets = sorted({r["budget"] for r in chosen if r["budget"] != FULL}, key=_budget_sort_key)
        names = _order((r["method"] for r in chosen), methods)
        cells: dict[tuple[str, str, float, int], list[float]] = defaultdict(list)
        for r in chosen:
            cells[(r["method"], r["budget"], r["meta"]["depth"], r["meta"]["length"])].append(r["score"])
        columns = max(1, len(budgets))
        fig = Figure(figsize=(max(6.0, 1.7 * columns + 1.8), 1.2 * len(names) + 1.0), layout="constrained")
        image = None
        for row_index, method in enumerate(names):
            for col_index, budget in enumerate(
                [FULL] if (method, FULL) in {(m, b) for m, b, _, _ in cells} else budgets
            ):
                ax = fig.add_subplot(len(names), columns, row_index * columns + col_index + 1)
                values = [
                    [_mean(cells.get((method, budget, depth, length), [])) for length in lengths]
                    for depth in depths
                ]
                image = ax.imshow(values, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
                ax.set_title(f"{method}" + ("" if budget == FULL else f", C={budget}"), fontsize=7)
                ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=6)
                ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=6)
        if image is not None:
            fig.colorbar(image, ax=fig.axes, shrink=0.5, label="string match")
        fig.suptitle(
            f"NIAH, {SETTING_NAMES.get(setting, setting)}: needle depth (rows) × context tokens (columns)",
            fontsize=9,
        )
        path = folder / f"niah_heatmap_{setting}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def write_report(
    rows: Sequence[dict[str, Any]],
    folder: str | Path,
    title: str = "lkv eval",
    methods: Sequence[str] = (),
    notes: Sequence[str] = (),
    appendix: Sequence[str] = (),
) -> Path:
    """Write summary.csv, report.md, plots/ and tensorboard/eval/ into ``folder``; returns report.md's path.

    Args:
        rows: result rows (``results.jsonl``).
        methods: preferred method order in tables and legends.
        notes: extra markdown paragraphs placed after the title (timings, settings).
        appendix: extra markdown lines placed after the plots (sections of their own).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    write_csv(summary, folder / "summary.csv")
    plots = plot_budget_curves(summary, folder / "plots", methods)
    plots += plot_niah_heatmaps(rows, folder / "plots", methods)
    write_eval_runs(summary, folder / "tensorboard" / "eval")
    parts = [f"# {title}", "", *notes, "" if notes else "", markdown_tables(summary, methods), "## Plots", ""]
    parts += [f"![{p.stem}](plots/{p.name})" for p in plots]
    parts += [
        "",
        "Per-sample results: `results.jsonl`; means: `summary.csv`; TensorBoard: `tensorboard/`.",
        "",
        *appendix,
    ]
    path = folder / "report.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _slug(name: str) -> str:
    return name.replace("/", "_")
