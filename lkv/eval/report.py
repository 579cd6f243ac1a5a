"""Reports of ``lkv eval`` results: summary CSV, markdown tables, PNG plots and TensorBoard runs.

``write_report(rows, folder)`` turns the rows of ``results.jsonl`` into::

    summary.csv                    mean of every metric per (task, setting, method, budget), with the count
                                   ``n`` and the 95 % interval ``ci_low``..``ci_high`` of the main score
    comparisons.csv                paired tests of each method vs FullKV and vs the best training-free
                                   baseline (:mod:`lkv.eval.paired`)
    report.md                      one table per task and setting (methods × budgets, main metric × 100 with
                                   its interval), the paired comparisons in words, per-family needle
                                   tables, the importance table, links to the plots
    plots/<task>_<setting>.png     main metric vs budget, one line per method with error bars (FullKV dashed)
    plots/niah_heatmap_<setting>.png   needle depth × context length, one panel per method and budget
    <task>/all rows                multi-question tasks: per context, whether every question was answered
                                   (:mod:`lkv.eval.all_answered`), reported as a task of its own
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

from lkv.eval.all_answered import all_answered_rows
from lkv.eval.paired import comparison_markdown, paired_comparisons
from lkv.eval.results import FULL, NO_BUDGET, budget_order
from lkv.eval.stats import is_binary, mean_interval
from lkv.eval.tensorboard import write_eval_runs

SMOKE_N = 30  # cells with fewer samples are labelled a smoke test: their 95 % intervals span ~30+ points
REPORT_FILE = "report.md"
SETTING_NAMES = {"aware": "question-aware", "agnostic": "question-agnostic"}


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means of ``score`` and every metric per (task, setting, method, budget), with the sample count ``n``
    and the 95 % interval ``ci_low``..``ci_high`` of ``score``: Wilson when every score of the task is 0 or 1
    (an accuracy), a bootstrap of the mean otherwise."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    by_task: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        groups[(row["task"], row["setting"], row["method"], row["budget"])].append(row)
        by_task[row["task"]].append(row["score"])
    binary = {task: is_binary(scores) for task, scores in by_task.items()}
    summary = []
    for (task, setting, method, budget), members in groups.items():
        scores = [r["score"] for r in members]
        low, high = mean_interval(scores, binary=binary[task])
        entry: dict[str, Any] = {
            "task": task,
            "setting": setting,
            "method": method,
            "budget": budget,
            "n": len(members),
            "score": sum(scores) / len(scores),
            "ci_low": low,
            "ci_high": high,
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
            budget_order(e["budget"]),
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
            budgets = sorted({e["budget"] for e in chosen if e["budget"] != FULL}, key=budget_order)
            cell = {(e["method"], e["budget"]): e for e in chosen}
            lines += [f"**{task}**, {SETTING_NAMES.get(setting, setting)} {_cell_note(chosen)}", ""]
            lines.append("| method | " + " | ".join(f"C={b}" for b in budgets) + " |")
            lines.append("|---|" + "---:|" * len(budgets))
            for method in _order((e["method"] for e in chosen), methods):
                if (method, FULL) in cell:
                    values = [cell[(method, FULL)]] * len(budgets)
                else:
                    values = [cell.get((method, b)) for b in budgets]
                lines.append(f"| {method} | " + " | ".join(_pct_interval(v) for v in values) + " |")
            lines.append("")
    return "\n".join(lines)


def _cell_note(entries: Sequence[dict[str, Any]]) -> str:
    """'(score × 100 [95 % interval], n = 60 per cell)', flagged as a smoke test below :data:`SMOKE_N`."""
    counts = sorted({e["n"] for e in entries})
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    note = f"(score × 100 [95 % interval], n = {n} per cell)"
    if counts[0] < SMOKE_N:
        note += f" — *smoke test: under {SMOKE_N} samples per cell, not a result*"
    return note


def _pct_interval(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "–"
    return f"{_pct(entry['score'])} [{100 * entry['ci_low']:.0f}, {100 * entry['ci_high']:.0f}]"


#: ``meta`` keys the report breaks end-task scores down by, with their table titles
BREAKDOWNS = {
    "family": "needle family",
    "length": "context length (tokens)",
    "fact_kind": "fact kind",
    "question_index": "question index",
    "bin": "the needle's measured distance from the end (far ≥ 1,536 tokens, near ≤ 1,024)",
    "source": "text source",
    "kind": "kind of fact",
}


def breakdown_tables(rows: Sequence[dict[str, Any]], key: str, methods: Sequence[str] = ()) -> list[str]:
    """Markdown: per task whose samples take several values of ``meta[key]`` (a needle family, a context
    length) and per setting, the mean score × 100 per value and method (rows) at each budget (columns), with
    the value's n (and a family's distribution)."""
    lines: list[str] = []
    tagged = [r for r in rows if r["budget"] != NO_BUDGET and key in r.get("meta", {})]
    for task in dict.fromkeys(r["task"] for r in tagged):
        chosen = [r for r in tagged if r["task"] == task]
        values = sorted(dict.fromkeys(r["meta"][key] for r in chosen), key=_natural)
        if len(values) < 2:
            continue
        for setting in _order((r["setting"] for r in chosen), list(SETTING_NAMES)):
            here = [r for r in chosen if r["setting"] == setting]
            budgets = sorted({r["budget"] for r in here if r["budget"] != FULL}, key=budget_order)
            if not budgets:
                continue  # FullKV alone: the main table already gives its score
            present = [
                v for v in values if any(r["meta"][key] == v for r in here)
            ]  # a partial run lacks some
            cells: dict[tuple[Any, str, str], list[float]] = defaultdict(list)
            for r in here:
                cells[(r["meta"][key], r["method"], r["budget"])].append(r["score"])
            lines += [
                f"**{task}** by {BREAKDOWNS.get(key, key)}, {SETTING_NAMES.get(setting, setting)} (score × 100)",
                "",
                f"| {key} | method | " + " | ".join(f"C={b}" for b in budgets) + " |",
                "|---|---|" + "---:|" * len(budgets),
            ]
            for value in present:
                example = next(r for r in here if r["meta"][key] == value)
                side = f"{example['meta'].get('distribution', '?')}, " if key == "family" else ""
                for method in _order((r["method"] for r in here), methods):
                    full = cells.get((value, method, FULL))
                    scores = [full or cells.get((value, method, b), []) for b in budgets]
                    n = max(len(v) for v in scores)
                    lines.append(
                        f"| {value} ({side}n = {n}) | {method} | "
                        + " | ".join(_pct(_mean(v)) for v in scores)
                        + " |"
                    )
            lines.append("")
    return lines


def _natural(value: Any) -> tuple[int, float | str]:
    """Numbers ascending before text in first-seen order (a stable sort keeps that)."""
    return (0, value) if isinstance(value, int | float) else (1, "")


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
    """One PNG per (task, setting): main score vs budget, a line per method with 95 % error bars, FullKV as a
    dashed level inside its shaded interval."""
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
                (
                    {**e, "budget": float(e["budget"])}
                    for e in chosen
                    if e["method"] == method and e["budget"] != FULL
                ),
                key=lambda e: e["budget"],
            )
            full = [e for e in chosen if e["method"] == method and e["budget"] == FULL]
            if full:
                ax.axhline(100 * full[0]["score"], color="black", linestyle="--", linewidth=1, label=method)
                ax.axhspan(100 * full[0]["ci_low"], 100 * full[0]["ci_high"], color="black", alpha=0.06)
            elif points:
                ax.errorbar(
                    [e["budget"] for e in points],
                    [100 * e["score"] for e in points],
                    yerr=[
                        [100 * (e["score"] - e["ci_low"]) for e in points],
                        [100 * (e["ci_high"] - e["score"]) for e in points],
                    ],
                    marker="o",
                    capsize=3,
                    label=method,
                )
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
        budgets = sorted({r["budget"] for r in chosen if r["budget"] != FULL}, key=budget_order)
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
    rows = [*rows, *all_answered_rows(rows)]  # multi-question tasks: every question of a context answered
    summary = summarize(rows)
    write_csv(summary, folder / "summary.csv")
    comparisons = paired_comparisons(rows)
    if comparisons:
        write_csv(comparisons, folder / "comparisons.csv")
    plots = plot_budget_curves(summary, folder / "plots", methods)
    plots += plot_niah_heatmaps(rows, folder / "plots", methods)
    write_eval_runs(summary, folder / "tensorboard" / "eval")
    parts = [f"# {title}", "", *notes, "" if notes else "", markdown_tables(summary, methods)]
    parts += comparison_markdown(comparisons, methods)
    for key in BREAKDOWNS:
        parts += breakdown_tables(rows, key, methods)
    parts += ["## Plots", ""]
    parts += [f"![{p.stem}](plots/{p.name})" for p in plots]
    parts += [
        "",
        "Per-sample results: `results.jsonl`; means with 95 % intervals: `summary.csv`; paired tests: "
        "`comparisons.csv`; TensorBoard: `tensorboard/`.",
        "",
        *appendix,
    ]
    path = folder / REPORT_FILE
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _slug(name: str) -> str:
    return name.replace("/", "_")
