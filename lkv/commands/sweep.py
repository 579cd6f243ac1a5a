"""`lkv sweep`: a grid of `lkv fit` runs (+ cost and an optional `lkv eval` each), resumable, with a summary.

    lkv sweep --config configs/sweeps/lookahead_targets_smollm2.yaml                 # here, point by point
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml               # a SLURM job array
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml --summarize true   # once it ended

Every point of the grid (the product of the value lists, in the order given) is a full ``lkv fit`` of the
base config with the point's values set at dotted keys (``model.num_lookahead``, ``model.lora_targets``,
``trainer.max_steps``, ...). Each fit runs in its own process, so Lightning's launcher handles
``trainer.devices``/``strategy`` (DDP over every GPU of the machine, one point after another). Keys
starting with ``eval.`` are arguments of ``lkv eval`` instead (e.g. ``eval.budgets``). After the fit the
sweep times the trained module (lookahead step vs plain prefill, :func:`checkpoint_overhead`) and, with
``eval_config``, runs ``lkv eval`` on its checkpoint.

Two ways to run the points, both through :func:`run_point` (so a point's ``result.json`` is the same):
without a ``launcher:`` section (or with ``--launcher null``) this process runs them one after another and
then writes the summary; with one, every unfinished point becomes one job of a submitit job array
(:mod:`lkv.commands.sweep_launch`: SLURM, or submitit's local executor) and ``--summarize true`` writes the
summary once the jobs have ended, refusing (with each job's log) a grid that is not complete unless
``--allow_partial true``.

Output folder (``output``)::

    points/<point>/config.yaml    the fit config this point ran (base + overrides + point values)
    points/<point>/checkpoints/   its checkpoints (``last.ckpt`` resumes an interrupted fit)
    points/<point>/fit.log        the fit's stdout and stderr
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

import copy
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit
import yaml
from jsonargparse import auto_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.commands.eval import evaluate
from lkv.commands.signals import exit_on_sigterm
from lkv.commands.sweep_launch import (
    JOBS_FOLDER,
    Launcher,
    active_jobs,
    check_points_fit,
    job_outcome,
    job_rank,
    parse_launcher,
    read_job_record,
    submit_points,
)
from lkv.eval.report import summarize
from lkv.eval.results import NO_BUDGET, RESULTS_FILE, RUN_FILE, ResultsFile, copy_adapter_free
from lkv.eval.stats import bootstrap_interval
from lkv.eval.tensorboard import rewrite_session
from lkv.eviction.presses.lookaheadkv import load_lookahead
from lkv.train.cli import resolved_fit_config
from lkv.train.export import resolve_adapter
from lkv.train.grid import grid_points, point_name, write_summary
from lkv.train.overhead import lookahead_overhead

RESULT_FILE = "result.json"
EVAL_PREFIX = "eval."
CHECKPOINT_CLASS = "ModelCheckpoint"


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    """Set ``config[a][b][c] = value`` for ``key = "a.b.c"``; numeric parts index lists, missing dicts are made.

    Raises:
        KeyError: naming the key and the part that leads into something other than a dict or list.
    """
    parts = key.split(".")
    node: Any = config
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise KeyError(
                f"config key {key!r}: {'.'.join(parts[: depth + 1])!r} is not a section or list item"
            )
        if node is None:
            raise KeyError(
                f"config key {key!r}: {'.'.join(parts[: depth + 1])!r} is empty in the base config"
            )
    last = parts[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise KeyError(f"config key {key!r}: {'.'.join(parts[:-1])!r} is not a section or list item")


def fit_values(values: dict[str, Any]) -> dict[str, Any]:
    """A grid point's values for the fit config (its ``eval.`` keys are `lkv eval` arguments)."""
    return {k: v for k, v in values.items() if not k.startswith(EVAL_PREFIX)}


def point_config(base: dict[str, Any], values: dict[str, Any], folder: Path, logs: Path) -> dict[str, Any]:
    """The base fit config with ``values`` set, TensorBoard in ``logs`` and every ModelCheckpoint (one is added
    if there is none) saving ``last.ckpt`` in ``folder/checkpoints``.

    Raises:
        ValueError: if the base config has a logger other than one TensorBoardLogger.
    """
    config = copy.deepcopy(base)
    for key, value in values.items():
        set_key(config, key, value)
    trainer = config.setdefault("trainer", {})
    logger = trainer.get("logger", {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"})
    if not isinstance(logger, dict) or not str(logger.get("class_path", "")).endswith("TensorBoardLogger"):
        raise ValueError(f"trainer.logger: a sweep needs one TensorBoardLogger, found {logger!r}")
    logger["init_args"] = {
        **logger.get("init_args", {}),
        **{"save_dir": str(logs.parent), "name": logs.name, "version": "fit", "default_hp_metric": False},
    }
    trainer["logger"] = logger
    # The sweep writes the run's HParams session itself, with the grid's axes and the eval and cost results
    # (`write_sessions`); the fit's own session, with its module settings only, would shadow it.
    trainer["enable_autolog_hparams"] = False
    callbacks = trainer.setdefault("callbacks", []) or []
    checkpoints = [
        c
        for c in callbacks
        if isinstance(c, dict) and str(c.get("class_path", "")).endswith(CHECKPOINT_CLASS)
    ]
    if not checkpoints:
        checkpoints = [{"class_path": f"lightning.pytorch.callbacks.{CHECKPOINT_CLASS}"}]
        callbacks.extend(checkpoints)
    for callback in checkpoints:
        # The sweep reads `last.ckpt` (timing, eval) and resumes an interrupted fit from it.
        callback["init_args"] = {**callback.get("init_args", {}), "dirpath": str(folder / "checkpoints")}
        callback["init_args"]["save_last"] = True
    trainer["callbacks"] = callbacks
    return config


def last_scalars(log_dir: Path) -> dict[str, float]:
    """The last logged value of every TensorBoard scalar under ``log_dir``."""
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    return {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}


def checkpoint_overhead(
    checkpoint: Path, tokens: int, repeats: int, dtype: str = "float32", device: str | None = None
) -> dict[str, float]:
    """``prefill_ms``, ``lookahead_ms`` and their ratio ``overhead`` for a checkpoint's module
    (:func:`lkv.train.overhead.lookahead_overhead` on a ``tokens``-token prompt, medians of ``repeats``)."""
    model, _, press = load_lookahead(resolve_adapter(checkpoint), dtype=dtype, device=device)
    return lookahead_overhead(model, {"lookahead": press.adapter}, tokens, repeats)["lookahead"]


def eval_scores(folder: Path, method: str = "lookaheadkv") -> tuple[dict[str, float], dict[str, list[float]]]:
    """``method``'s scores in an ``lkv eval`` folder and their 95 % intervals.

    Keys: ``eval/<task>/<setting>@<budget>`` for end tasks (the cell's mean score; Wilson or bootstrap
    interval as in the eval's ``summary.csv``), ``eval/<task>/<metric>`` for importance rows (every metric's
    mean over the held-out labels; percentile-bootstrap interval). Returns ``(scores, intervals)`` with
    ``intervals[key] = [low, high, n]``.
    """
    rows = [r for r in ResultsFile(folder / RESULTS_FILE).rows if r["method"] == method]
    scores: dict[str, float] = {}
    intervals: dict[str, list[float]] = {}
    for cell in summarize(r for r in rows if r["budget"] != NO_BUDGET):
        key = f"eval/{cell['task']}/{cell['setting']}@{cell['budget']}"
        scores[key] = cell["score"]
        intervals[key] = [cell["ci_low"], cell["ci_high"], cell["n"]]
    importance: dict[str, list[float]] = {}
    for row in rows:
        if row["budget"] == NO_BUDGET:
            for name, value in row["metrics"].items():
                importance.setdefault(f"eval/{row['task']}/{name}", []).append(value)
    for key, values in importance.items():
        scores[key] = sum(values) / len(values)
        intervals[key] = [*bootstrap_interval(values), len(values)]
    return scores, intervals


def run_point(
    values: dict[str, Any],
    base: dict[str, Any],
    output: Path,
    eval_config: str | None,
    overhead_tokens: int,
    overhead_repeats: int,
    device: str | None,
    rank: int = 0,
) -> dict[str, Any] | None:
    """Fit (in a subprocess), time and optionally evaluate one grid point; write and return its result.

    ``rank``: this process's task in a multi-task job (:mod:`lkv.commands.sweep_launch`: one task per GPU,
    each ``lkv fit`` child one DDP rank found by Lightning's SLURM detection). Every task runs the fit
    (rank r > 0 logs to ``fit.rank<r>.log``); only rank 0 times, evaluates and writes ``result.json``, and
    the others return None.
    """
    name = point_name(values)
    folder = output / "points" / name
    folder.mkdir(parents=True, exist_ok=True)
    logs = output / "tensorboard" / name
    config_path = folder / "config.yaml"
    config = point_config(base, fit_values(values), folder, logs)
    # every task of a job writes the same text: a rename, so none reads another's half-written file
    staged = folder / f".config.rank{rank}.yaml"
    staged.write_text(yaml.safe_dump(config, sort_keys=False))
    staged.replace(config_path)
    command = [sys.executable, "-m", "lkv.cli", "fit", "--config", str(config_path)]
    last = folder / "checkpoints" / "last.ckpt"
    if last.exists():  # an interrupted fit of this point
        command += ["--ckpt_path", str(last)]
    log_path = folder / ("fit.log" if rank == 0 else f"fit.rank{rank}.log")
    start = time.perf_counter()
    with log_path.open("a", encoding="utf-8") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    fit_s = time.perf_counter() - start
    if status != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8").splitlines()[-15:])
        raise RuntimeError(
            f"sweep point {name}: `{' '.join(command)}` exited with {status}; log tail:\n{tail}"
        )
    if rank != 0:
        return None
    if not last.exists():
        raise FileNotFoundError(f"sweep point {name}: the fit wrote no {last}; see {folder / 'fit.log'}")
    result: dict[str, Any] = {"point": name, "values": values, "fit_s": fit_s}
    result["metrics"] = last_scalars(logs / "fit")
    if overhead_tokens > 0:
        dtype = config["model"].get("dtype", "float32")
        result["cost"] = checkpoint_overhead(last, overhead_tokens, overhead_repeats, dtype, device)
    if eval_config is not None:
        donor = None if (folder / "eval").exists() else adapter_free_donor(output, values)
        if donor is not None:  # FullKV and the baselines do not change with the adapter: evaluated once
            copied = copy_adapter_free(donor, folder / "eval")
            print(f"lkv sweep: point {name}: {copied} rows of methods without an adapter copied from {donor}")
        args = ["--config", eval_config, "--adapter", str(last), "--output", str(folder / "eval")]
        for key, value in values.items():
            if key.startswith(EVAL_PREFIX):
                args += [f"--{key[len(EVAL_PREFIX) :]}", json.dumps(value)]
        args += ["--progress", "false"] + ([] if device is None else ["--device", device])
        auto_cli(evaluate, args=args, as_positional=False)
        scores, intervals = eval_scores(folder / "eval")
        result["metrics"].update(scores)
        result["intervals"] = intervals
    (folder / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


def adapter_free_donor(output: Path, values: dict[str, Any]) -> Path | None:
    """The eval folder of a finished point with the same ``eval.`` values (hence the same eval run but for
    the adapter), whose FullKV and baseline rows a new point can copy; None if there is none."""
    wanted = {k: v for k, v in values.items() if k.startswith(EVAL_PREFIX)}
    for result in sorted(output.glob(f"points/*/{RESULT_FILE}")):
        done = json.loads(result.read_text())["values"]
        same_eval = {k: v for k, v in done.items() if k.startswith(EVAL_PREFIX)} == wanted
        if same_eval and (result.parent / "eval" / RUN_FILE).is_file():
            return result.parent / "eval"
    return None


# ---------------------------------------------------------------------------------------------------------
# Summary


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


# ---------------------------------------------------------------------------------------------------------
# Launched sweeps and their summary


def point_job(
    values: dict[str, Any],
    base: dict[str, Any],
    output: Path,
    eval_config: str | None,
    overhead_tokens: int,
    overhead_repeats: int,
    device: str | None,
) -> dict[str, Any] | None:
    """What one job of a launched sweep runs: :func:`run_point`, as this task's rank of the job."""
    return run_point(
        values, base, output, eval_config, overhead_tokens, overhead_repeats, device, rank=job_rank()
    )


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


def launch_points(
    launcher: Launcher,
    points: list[dict[str, Any]],
    base: dict[str, Any],
    output: Path,
    job_args: tuple[Any, ...],
) -> tuple[list[submitit.Job], str]:
    """Submit every point that has no result and no job still queued or running as one job array.

    ``job_args``: the arguments of :func:`point_job` after ``values``, ``base`` and ``output``. Returns
    the jobs and a line saying what was submitted, done and still in flight.
    """
    unfinished = [v for v in points if not (output / "points" / point_name(v) / RESULT_FILE).is_file()]
    records = {point_name(v): read_job_record(output / "points" / point_name(v)) for v in unfinished}
    running = active_jobs([r for r in records.values() if r is not None])
    todo, active = [], []
    for values in unfinished:
        record = records[point_name(values)]
        if record is not None and record["job_id"] in running:
            active.append(f"{point_name(values)} (job {record['job_id']})")
        else:
            todo.append(values)
    done = len(points) - len(unfinished)
    # the trainer each job will run (the folders do not matter here)
    fits = {point_name(v): point_config(base, fit_values(v), output, output) for v in todo}
    check_points_fit(launcher, fits)
    jobs_folder = Path(launcher.folder) if launcher.folder else output / JOBS_FOLDER
    jobs = []
    if todo:
        jobs = submit_points(
            launcher,
            jobs_folder,
            [output / "points" / point_name(v) for v in todo],
            point_job,
            [(v, base, output, *job_args) for v in todo],
        )
    if len(jobs) > 1:
        span = f"jobs {jobs[0].job_id} … {jobs[-1].job_id}"
    else:
        span = f"job {jobs[0].job_id}" if jobs else "no job"
    line = (
        f"lkv sweep: {len(points)} points: {len(todo)} submitted to {launcher.executor} ({span}, logs in "
        f"{jobs_folder}), {done} already done, {len(active)} still queued or running"
        + (f": {', '.join(active)}" if active else "")
    )
    return jobs, line


# ---------------------------------------------------------------------------------------------------------
# The verb


def sweep(
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

    Args:
        base: the `lkv fit` config every point starts from (e.g. ``configs/smollm2_135m.yaml``).
        grid: dotted key → values, e.g. ``{model.num_lookahead: [4, 16], model.lora_targets: [none,
            all-linear]}``; ``eval.<arg>`` keys are `lkv eval` arguments (e.g. ``eval.budgets``).
        output: sweep folder (see the module docstring); rerunning resumes it.
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
        launcher: job resources of one point (:class:`lkv.commands.sweep_launch.Launcher`: executor,
            nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem_gb, timeout_min, partition,
            array_parallelism, slurm_args, setup, name, folder, wait): submit the unfinished points as a
            submitit job array and return; none (``--launcher null``): run them here, one after another.
        summarize: fit nothing; summarise the points' ``result.json`` files (after the jobs have ended).
        allow_partial: with ``summarize``, summarise the finished points even if some have no result
            (they are still listed); without it, missing points are an error.
    """
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
    with exit_on_sigterm():
        for index, values in enumerate(points, 1):
            done = out / "points" / point_name(values) / RESULT_FILE
            if done.exists():
                results.append(json.loads(done.read_text()))
                continue
            print(f"lkv sweep: point {index}/{len(points)} {point_name(values)}", flush=True)
            results.append(
                run_point(values, config, out, eval_config, overhead_tokens, overhead_repeats, device)
            )
            ran += 1
            write_sessions(results, out / "tensorboard", grid, score)
    summary = summarize_points(results, out, *layout)
    return f"lkv sweep: {len(points)} points ({ran} run now, {len(points) - ran} already done); summary: {summary}"
