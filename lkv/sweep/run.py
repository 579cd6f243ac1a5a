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


def run_sweep(
    base: str,
    grid: dict[str, list[Any]],
    output: str = "runs/sweep",
    overrides: dict[str, Any] | None = None,
    eval_config: str | None = None,
    score: str = "val/recall@64",
    size_key: str = "model.num_lookahead",
    group_key: str = "model.lora_targets",
    overhead_tokens: int = 1024,
    overhead_repeats: int = 5,
    device: str | None = None,
    summary_dir: str | None = None,
    launcher: dict[str, Any] | None = None,
    summarize: bool = False,
    allow_partial: bool = False,
) -> str:
    """Run a grid of `lkv fit` (+ timing, + `lkv eval`) points; skip finished ones; write a summary.

    The points run here one after another, or as a submitit job array (``launcher``). Returns the line
    `lkv sweep` prints.

    Args:
        base: the `lkv fit` config every point starts from (e.g. ``configs/smollm2_135m.yaml``).
        grid: dotted key → values, e.g. ``{model.num_lookahead: [4, 16], model.lora_targets: [none,
            all-linear]}``; ``eval.<arg>`` keys are `lkv eval` arguments (e.g. ``eval.budgets``).
        output: sweep folder (its layout: the module docstring); rerunning resumes it.
        overrides: dotted key → value applied to every point before its grid values (a reduced recipe,
            e.g. ``{trainer.max_steps: 64}``).
        eval_config: an `lkv eval` config run on every point's checkpoint (its ``lookaheadkv`` rows are
            kept); none: no eval.
        score: the metric of the ``group × size`` table and of the score plot (a logged ``val/...`` metric
            or an ``eval/...`` one).
        size_key, group_key: the grid keys of the plots' x axis and lines.
        overhead_tokens: prompt length of the lookahead-step vs prefill timing (0: no timing).
        overhead_repeats: timed repetitions (medians are reported).
        device: device of the timing and the eval (default: CPU); the fits use the config's trainer.
        summary_dir: where the summary, plots and per-point results go (default: ``output``), e.g. an
            ``experiments/`` folder that should not hold checkpoints.
        launcher: job resources of one point (:class:`lkv.sweep.launch.Launcher`: executor,
            nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem_gb, timeout_min, partition,
            array_parallelism, slurm_args, setup, name, folder, wait): submit the unfinished points as a
            submitit job array and return; none (``--launcher null``): run them here, one after another.
        summarize: fit nothing; summarise the points' ``result.json`` files (after the jobs have ended).
        allow_partial: with ``summarize``, summarise the finished points even if some have no result
            (they are still listed); without it, missing points are an error.

    Raises:
        FileNotFoundError: the base or eval config is missing, or (``summarize``) points have no result.
        ValueError: ``eval.`` grid keys without an ``eval_config``, or a bad ``launcher`` field.
    """
    # imported here, not at the top: the signature and this docstring are `lkv sweep --help`, which then
    # answers without loading torch, Lightning, submitit or matplotlib
    from lkv.sweep.grid import grid_points, point_name
    from lkv.sweep.launch import launch_points, parse_launcher
    from lkv.sweep.points import EVAL_PREFIX, RESULT_FILE, check_point_configs, run_point, set_key
    from lkv.sweep.summary import collect_results, summarize_points, write_sessions
    from lkv.train.cli import resolved_fit_config

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
