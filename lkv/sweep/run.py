"""A whole sweep: the grid's points run here one after another, or submitted as a job array, then summarised.

Every point of the grid (the product of the value lists, in the order given) is a full ``lkv fit`` of the
base config with the point's values set at dotted keys (``model.num_lookahead``, ``model.lora_targets``,
``trainer.max_steps``, ...). Each fit runs in its own process, so Lightning's launcher handles
``trainer.devices``/``strategy`` (DDP over every GPU of the machine, one point after another). Keys
starting with ``eval.`` are arguments of ``lkv eval`` instead (e.g. ``eval.budgets``). After the fit the
sweep times the trained module (lookahead step vs plain prefill, :func:`lkv.sweep.points.checkpoint_overhead`)
and, with ``eval_config``, runs ``lkv eval`` on its checkpoint (in its own process too).

Two ways to run the points, both through :func:`lkv.sweep.points.run_point` (so a point's ``result.json`` is
the same): without a launcher this process runs them one after another and then writes the summary; with
one, every unfinished point becomes one job of a submitit job array (:mod:`lkv.sweep.launch`: SLURM, or
submitit's local executor) and ``summarize`` writes the summary once the jobs have ended, refusing (with each
job's log) a grid that is not complete unless ``allow_partial``.

Output folder (``output``)::

    points/<point>/config.yaml    the fit config this point ran (base + overrides + point values)
    points/<point>/checkpoints/   its checkpoints (``last.ckpt`` resumes an interrupted fit)
    points/<point>/fit.log        the fit's stdout and stderr (``eval.log``: the eval's)
    points/<point>/eval/          its ``lkv eval`` folder (with ``eval_config``); it starts with the rows of
                                  FullKV and the other adapter-free methods copied from a finished point
                                  with the same ``eval.`` values, so those are evaluated once per sweep
    points/<point>/job.json       the submitit job that runs it and its log files (launched sweeps)
    points/<point>/result.json    values, final logged metrics, eval scores with their 95 % intervals and n,
                                  timings — written last: a point whose result exists is skipped by a rerun
    tensorboard/<point>/fit/      one TensorBoard run per point: the fit's curves and an HParams session with
                                  the point's grid values and results (``val/*``, ``eval/*``, ``cost/*``)
    jobs/                         submitit's pickles and job logs (``launcher.folder`` moves it)

Summary folder (``summary_dir``, default ``output``): ``summary.csv`` (eval scores with ``_low``, ``_high``
and ``_n`` columns), ``summary.md`` (a table of every point, eval scores with their intervals, and a
``group × size`` table of ``score``), ``results/<point>.json`` and ``plots/score_vs_size.png``,
``plots/overhead_vs_size.png`` (error bars where the score has intervals; one line when the grid has no
``group_key``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lkv.sweep.grid import grid_points, point_name
from lkv.sweep.launch import launch_points, parse_launcher
from lkv.sweep.points import EVAL_PREFIX, RESULT_FILE, check_point_configs, run_point, set_key
from lkv.sweep.summary import collect_results, summarize_points, write_sessions
from lkv.train.cli import resolved_fit_config


def run_sweep(
    *,
    base: str,
    grid: dict[str, list[Any]],
    output: str,
    overrides: dict[str, Any] | None,
    eval_config: str | None,
    score: str,
    size_key: str,
    group_key: str,
    overhead_tokens: int,
    overhead_repeats: int,
    device: str | None,
    summary_dir: str | None,
    launcher: dict[str, Any] | None,
    summarize: bool,
    allow_partial: bool,
) -> str:
    """`lkv sweep` with its parsed options (:func:`lkv.commands.sweep.sweep` gives each, and the errors raised):
    every point of ``grid`` run here one after another or submitted as a job array (``launcher``), or
    (``summarize``) the finished ones summarised. Returns the line `lkv sweep` prints."""
    base_path = Path(base)
    if not base_path.is_file():
        raise FileNotFoundError(f"sweep base config {base!r} not found")
    if eval_config is not None and not Path(eval_config).is_file():
        raise FileNotFoundError(f"sweep eval_config {eval_config!r} not found")
    # as `lkv fit` reads it: includes (`config: recipes/...`) merged, every default filled in
    config = resolved_fit_config(base_path)
    for key, value in (overrides or {}).items():
        set_key(config, key, value)
    points = grid_points(grid)
    if any(k.startswith(EVAL_PREFIX) for k in grid) and eval_config is None:
        raise ValueError(f"grid keys {[k for k in grid if k.startswith(EVAL_PREFIX)]} need an eval_config")
    launch = parse_launcher(launcher) if launcher is not None else None
    out = Path(output)
    layout = (grid, score, size_key, group_key, summary_dir)
    if summarize:
        results, missing = collect_results(points, out, allow_partial)
        summary = summarize_points(results, out, *layout)
        left = f"; {len(missing)} without a result left out:\n  " + "\n  ".join(missing) if missing else ""
        return f"lkv sweep: summarised {len(results)} of {len(points)} points: {summary}{left}"
    check_point_configs(points, config)
    if launch is not None:
        job_args = (eval_config, overhead_tokens, overhead_repeats, device)
        jobs, line = launch_points(launch, points, config, out, job_args)
        if not launch.wait:
            return f"{line}\nwhen they have ended: the same `lkv sweep` command with --summarize true"
        for job in jobs:
            job.wait()
        results, _ = collect_results(points, out)
        return f"{line}\nlkv sweep: all ended; summary: {summarize_points(results, out, *layout)}"
    results, ran = [], 0
    for index, values in enumerate(points, 1):
        done = out / "points" / point_name(values) / RESULT_FILE
        if done.exists():
            results.append(json.loads(done.read_text()))
            continue
        print(f"lkv sweep: point {index}/{len(points)} {point_name(values)}", flush=True)
        results.append(run_point(values, config, out, eval_config, overhead_tokens, overhead_repeats, device))
        ran += 1
        write_sessions(results, out / "tensorboard", grid, score)
    summary = summarize_points(results, out, *layout)
    return f"lkv sweep: {len(points)} points ({ran} run now, {len(points) - ran} already done); summary: {summary}"
