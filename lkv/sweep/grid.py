"""Grids of ablation points: their enumeration and names, and the summary table and plots of their results.

Shared by `lkv sweep` (one `lkv fit` per point) and in-run ablations; a *point* is a dict of dotted config
key → value (``{"model.num_lookahead": 16, "model.lora_targets": ["q_proj", "v_proj"]}``) and a *result* is
``{"point": name, "values": point, "fit_s": seconds, "metrics": {...}, "cost": {...}, "intervals": {...}}``
where the optional ``intervals`` map a metric to its 95 % interval and sample count ``[low, high, n]``.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure


def value_label(value: Any) -> str:
    """Short text of a grid value: lists join with ``+`` (``[q_proj, v_proj]`` → ``q_proj+v_proj``)."""
    if isinstance(value, list | tuple):
        return "+".join(value_label(v) for v in value)
    return str(value)


def point_name(point: dict[str, Any]) -> str:
    """Folder name of a grid point: ``<last key part>=<value>`` joined by ``,``, safe for file names."""
    text = ",".join(f"{key.rsplit('.', 1)[-1]}={value_label(value)}" for key, value in point.items())
    return re.sub(r"[^A-Za-z0-9_.+=,-]", "_", text)


def grid_points(grid: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first key varying slowest.

    Raises:
        ValueError: naming a key whose values are not a non-empty list.
    """
    for key, values in grid.items():
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid.{key}: expected a non-empty list of values, found {values!r}")
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else value_label(value)


def summary_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per point: its values, ``fit_s``, cost figures, metrics, and ``<metric>_low``,
    ``<metric>_high``, ``<metric>_n`` for the metrics with an interval."""
    rows = []
    for r in results:
        row = {"point": r["point"], **r["values"], "fit_s": r["fit_s"], **r.get("cost", {}), **r["metrics"]}
        for name, (low, high, n) in r.get("intervals", {}).items():
            row |= {f"{name}_low": low, f"{name}_high": high, f"{name}_n": n}
        rows.append(row)
    return rows


def _with_interval(row: dict[str, Any], column: str) -> str:
    """``0.758 [0.743, 0.771]`` for a metric with an interval, else the plain value."""
    if f"{column}_low" not in row:
        return _fmt(row.get(column, ""))
    return f"{row[column]:.3f} [{row[f'{column}_low']:.3f}, {row[f'{column}_high']:.3f}]"


def write_summary(
    results: list[dict[str, Any]],
    folder: Path,
    grid: dict[str, Sequence[Any]],
    score: str,
    size_key: str,
    group_key: str,
) -> Path:
    """``summary.csv``, ``summary.md``, ``results/<point>.json`` and the two plots in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(results)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with (folder / "summary.csv").open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: (f"{v:.6g}" if isinstance(v, float) else value_label(v)) for k, v in row.items()}
            )
    (folder / "results").mkdir(exist_ok=True)
    for result in results:
        (folder / "results" / f"{result['point']}.json").write_text(json.dumps(result, indent=2))

    shown = [*grid, score] + [c for c in ("overhead", "lookahead_ms", "prefill_ms", "fit_s") if c in columns]
    with_interval = {name for r in results for name in r.get("intervals", {})}
    bounds = {f"{name}_{part}" for name in with_interval for part in ("low", "high", "n")}
    shown += sorted(c for c in columns if c.startswith(("val/", "eval/")) and c != score and c not in bounds)
    lines = [f"# Sweep summary ({len(rows)} points; score: `{score}`)", ""]
    if with_interval:
        lines += [
            "Eval scores: mean [95 % interval]; the sample count of each is in `summary.csv` (`_n`).",
            "",
        ]
    lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(_with_interval(row, c) for c in shown) + " |" for row in rows]
    if size_key in grid:
        _plot_by_size(rows, folder / "plots" / "score_vs_size.png", score, size_key, group_key, grid)
        if "overhead" in columns:
            _plot_by_size(
                rows, folder / "plots" / "overhead_vs_size.png", "overhead", size_key, group_key, grid
            )
    if size_key in grid and group_key in grid:
        sizes = [value_label(s) for s in grid[size_key]]
        lines += ["", f"`{score}` by `{group_key}` (rows) × `{size_key}` (columns):", ""]
        lines += [f"| {group_key} | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for group in grid[group_key]:
            cells = []
            for size in grid[size_key]:
                hits = [
                    r[score] for r in rows if r[group_key] == group and r[size_key] == size and score in r
                ]
                cells.append(f"{sum(hits) / len(hits):.3f}" if hits else "")
            lines.append(f"| {value_label(group)} | " + " | ".join(cells) + " |")
    if size_key in grid:
        lines += ["", "![score](plots/score_vs_size.png)"]
        if "overhead" in columns:
            lines += ["", "![overhead](plots/overhead_vs_size.png)"]
    path = folder / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _plot_by_size(
    rows: list[dict[str, Any]],
    path: Path,
    metric: str,
    size_key: str,
    group_key: str,
    grid: dict[str, Sequence[Any]],
) -> None:
    """``metric`` vs ``size_key`` (log₂ axis), one line per value of ``group_key`` (mean over other keys), or
    one line when the grid has no ``group_key``. A point of one run with an interval gets it as error bars."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    grouped = group_key in grid
    for group in grid[group_key] if grouped else [None]:
        xs, ys, low, high = [], [], [], []
        for size in grid[size_key]:
            hits = [
                r
                for r in rows
                if (not grouped or r[group_key] == group) and r[size_key] == size and metric in r
            ]
            if hits:
                xs.append(size)
                ys.append(sum(r[metric] for r in hits) / len(hits))
                single = hits[0] if len(hits) == 1 and f"{metric}_low" in hits[0] else None
                low.append(ys[-1] - single[f"{metric}_low"] if single else 0.0)
                high.append(single[f"{metric}_high"] - ys[-1] if single else 0.0)
        label = value_label(group) if grouped else metric
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(grid[size_key]), [value_label(s) for s in grid[size_key]])
    ax.minorticks_off()
    ax.set_xlabel(size_key)
    ax.set_ylabel(metric if metric != "overhead" else "lookahead step / prefill time")
    ax.legend(title=group_key if grouped else None)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
