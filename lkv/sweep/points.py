"""One grid point of `lkv sweep`: its fit config, its `lkv fit` and `lkv eval` runs (each its own process), its
cost figures and its ``result.json``.

A point folder (``<output>/points/<point>/``) holds ``config.yaml`` (the fit config it ran), ``checkpoints/``
(``last.ckpt`` resumes an interrupted fit), ``fit.log`` and ``eval.log`` (the runs' stdout and stderr),
``eval/`` (its `lkv eval` folder) and, written last, ``result.json``: a point whose result exists is done.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.eval.report import summarize
from lkv.eval.results import NO_BUDGET, RESULTS_FILE, RUN_FILE, ResultsFile, copy_adapter_free
from lkv.eval.stats import bootstrap_interval
from lkv.eviction.presses.lookaheadkv import load_lookahead
from lkv.perf.overhead import lookahead_overhead
from lkv.sweep.grid import point_name
from lkv.train.cli import check_hparams, resolved_fit_config
from lkv.train.export import resolve_adapter

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
    (:func:`lkv.perf.overhead.lookahead_overhead` on a ``tokens``-token prompt, medians of ``repeats``)."""
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


def check_point_configs(points: list[dict[str, Any]], base: dict[str, Any]) -> None:
    """Parse every point's fit config as its `lkv fit` will (:func:`lkv.train.cli.resolved_fit_config`, no
    model loads) and check its hyper-parameters, before the first fit starts: a bad grid key or value is one
    line naming the point, not a child's usage text hours into the sweep.

    Raises:
        ValueError: ``--grid: point NAME: what the parser or the check said``.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        for values in points:
            config = point_config(base, fit_values(values), Path(tmp), Path(tmp) / "logs")
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            try:
                check_hparams(resolved_fit_config(path).get("model") or {})
            except ValueError as error:
                message = " ".join(str(error).split()).removeprefix(f"{path}: ")
                raise ValueError(f"--grid: point {point_name(values)}: {message}") from None


def run_logged(point: str, verb_args: list[str], log_path: Path) -> float:
    """Run ``lkv <verb_args>`` in its own process, appending its stdout and stderr to ``log_path``; returns its
    wall seconds.

    Its own process: Lightning's launcher then handles ``trainer.devices``/``strategy`` of a fit, and a
    SIGTERM of the sweep (an exception in here) ends the child too.

    Raises:
        RuntimeError: naming the point and the command, with the log's last 15 lines, if it failed.
    """
    command = [sys.executable, "-m", "lkv.cli", *verb_args]
    start = time.perf_counter()
    with log_path.open("a", encoding="utf-8") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if status != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8").splitlines()[-15:])
        raise RuntimeError(
            f"sweep point {point}: `{' '.join(command)}` exited with {status}; log tail:\n{tail}"
        )
    return time.perf_counter() - start


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
    """Fit (`lkv fit`), time and optionally evaluate (`lkv eval`) one grid point; write and return its result.

    ``rank``: this process's task in a multi-task job (:mod:`lkv.sweep.launch`: one task per GPU,
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
    command = ["fit", "--config", str(config_path)]
    last = folder / "checkpoints" / "last.ckpt"
    if last.exists():  # an interrupted fit of this point
        command += ["--ckpt_path", str(last)]
    fit_s = run_logged(name, command, folder / ("fit.log" if rank == 0 else f"fit.rank{rank}.log"))
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
        args = ["eval", "--config", eval_config, "--adapter", str(last), "--output", str(folder / "eval")]
        for key, value in values.items():
            if key.startswith(EVAL_PREFIX):
                args += [f"--{key[len(EVAL_PREFIX) :]}", json.dumps(value)]
        args += ["--progress", "false"] + ([] if device is None else ["--device", device])
        run_logged(name, args, folder / "eval.log")
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
