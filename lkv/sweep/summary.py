"""The end of a sweep: every finished point's ``result.json`` collected (or why a point has none), an HParams
session in each point's TensorBoard run, and the summary table and plots (:func:`lkv.sweep.grid.write_summary`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lkv.core.tensorboard import rewrite_session
from lkv.sweep.grid import point_name, write_summary
from lkv.sweep.launch import job_outcome, read_job_record
from lkv.sweep.points import RESULT_FILE


def write_sessions(
    results: list[dict[str, Any]], logs: Path, grid: dict[str, Sequence[Any]], score: str
) -> None:
    """An HParams session in every finished point's run ``logs/<point>/fit``: the grid values as
    hyper-parameters (the grid as their domains), and as metrics ``score`` first, then every ``val/*`` and
    ``eval/*`` result and the cost figures. ``val/*`` values are the fit's own scalars; ``eval/*`` scores
    and ``cost/<figure>`` (``overhead``, ``lookahead_ms``, ``prefill_ms``, ``fit_s``) are written beside them.
    Rewritten whole each time, so every point shows the same metric columns."""
    extras = [
        {
            **{k: v for k, v in r["metrics"].items() if k.startswith("eval/")},
            **{f"cost/{k}": v for k, v in {**r.get("cost", {}), "fit_s": r["fit_s"]}.items()},
        }
        for r in results
    ]
    names = dict.fromkeys(
        k
        for r, extra in zip(results, extras, strict=True)
        for k in [*r["metrics"], *extra]
        if k.startswith(("val/", "eval/", "cost/"))
    )
    metrics = [score, *sorted(n for n in names if n != score)] if score in names else sorted(names)
    for result, extra in zip(results, extras, strict=True):
        run = logs / result["point"] / "fit"
        rewrite_session(run, result["values"], metrics, extra, domains=grid)


def collect_results(
    points: list[dict[str, Any]], output: Path, allow_partial: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``result.json`` of every point that has one, and one line per point that has none (why: its
    job's error or state and log, a local run that was stopped, or never run).

    Raises:
        FileNotFoundError: listing the points without a result, unless ``allow_partial`` (then only if
            no point has one).
    """
    results, missing = [], []
    for values in points:
        name = point_name(values)
        folder = output / "points" / name
        if (folder / RESULT_FILE).is_file():
            results.append(json.loads((folder / RESULT_FILE).read_text()))
            continue
        record = read_job_record(folder)
        if record is not None:
            why = job_outcome(record)
        elif (folder / "fit.log").is_file():
            why = f"started by a local `lkv sweep` that did not finish it; log: {folder / 'fit.log'}"
        else:
            why = "never run (not submitted: no job.json)"
        missing.append(f"{name}: {why}")
    if missing and (not allow_partial or not results):
        hint = (
            f", or pass --allow_partial true to summarise the {len(results)} finished"
            if results and not allow_partial
            else ""
        )
        raise FileNotFoundError(
            f"{output}: {len(missing)} of {len(points)} points have no {RESULT_FILE} (rerun the same "
            f"`lkv sweep` to run or submit them again{hint}):\n  " + "\n  ".join(missing)
        )
    return results, missing


def summarize_points(
    results: list[dict[str, Any]],
    output: Path,
    grid: dict[str, Sequence[Any]],
    score: str,
    size_key: str,
    group_key: str,
    summary_dir: str | None,
) -> Path:
    """Every finished point's HParams session, then the summary table and plots; returns ``summary.md``."""
    write_sessions(results, output / "tensorboard", grid, score)
    return write_summary(results, Path(summary_dir or output), grid, score, size_key, group_key)
