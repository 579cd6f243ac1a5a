"""`lkv sweep`: a grid of `lkv fit` runs (+ cost and an optional `lkv eval` each), resumable, with a summary.

    lkv sweep --config configs/sweeps/lookahead_targets_smollm2.yaml

Every point of the grid (the product of the value lists, in the order given) is a full ``lkv fit`` of the
base config with the point's values set at dotted keys (``model.num_lookahead``, ``model.lora_targets``,
``trainer.max_steps``, ...). Each fit runs in its own process, so Lightning's launcher handles
``trainer.devices``/``strategy`` (DDP over every GPU of the machine, one point after another). Keys
starting with ``eval.`` are arguments of ``lkv eval`` instead (e.g. ``eval.budgets``). After the fit the
sweep times the trained module (lookahead step vs plain prefill, :func:`lookahead_overhead`) and, with
``eval_config``, runs ``lkv eval`` on its checkpoint.

Output folder (``output``)::

    points/<point>/config.yaml    the fit config this point ran (base + overrides + point values)
    points/<point>/checkpoints/   its checkpoints (``last.ckpt`` resumes an interrupted fit)
    points/<point>/fit.log        the fit's stdout and stderr
    points/<point>/eval/          its ``lkv eval`` folder (with ``eval_config``)
    points/<point>/result.json    values, final logged metrics, eval scores, timings — written last: a point
                                  whose result exists is skipped by a rerun
    tensorboard/<point>/fit/      one TensorBoard run per point: the fit's curves and an HParams session with
                                  the point's grid values and results (``val/*``, ``eval/*``, ``cost/*``)

Summary folder (``summary_dir``, default ``output``): ``summary.csv``, ``summary.md`` (a table of every
point and a ``group × size`` table of ``score``), ``results/<point>.json`` and
``plots/score_vs_size.png``, ``plots/overhead_vs_size.png``.
"""

from __future__ import annotations

import copy
import csv
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import auto_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.commands.eval import evaluate
from lkv.core.generation import prefill
from lkv.eval.cells import NO_BUDGET
from lkv.eval.tensorboard import rewrite_session
from lkv.eviction.compressor import load_lookahead
from lkv.perf.timing import Case, time_interleaved
from lkv.train.cli import resolved_fit_config
from lkv.train.export import resolve_adapter
from lkv.train.grid import grid_points, point_name, write_summary

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


def lookahead_overhead(
    checkpoint: Path,
    tokens: int,
    repeats: int,
    dtype: str = "float32",
    device: str | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Seconds of the lookahead step and of a plain prefill of a ``tokens``-token prompt, and their ratio.

    The lookahead step is :meth:`LookaheadAdapter.predict` on the prompt's cache (``M`` tokens with the
    adapter on, capture of their attention rows, crop back); both run interleaved (medians of ``repeats``).
    """
    model, _, press = load_lookahead(resolve_adapter(checkpoint), dtype=dtype, device=device)
    dev = next(model.parameters()).device
    ids = torch.randint(
        0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed)
    )
    ids = ids.to(dev)
    with torch.no_grad():
        cache, _ = prefill(model, ids)

        def plain_prefill() -> None:
            prefill(model, ids)

        def lookahead_step() -> None:
            press.adapter.predict(cache, tokens)  # crops its own K/V off again

        cases = {"prefill": Case(run=plain_prefill), "lookahead": Case(run=lookahead_step)}
        timings = time_interleaved(cases, repeats=repeats, warmup=1, device=dev)
    prefill_s, lookahead_s = timings.median("prefill"), timings.median("lookahead")
    return {
        "prefill_ms": 1e3 * prefill_s,
        "lookahead_ms": 1e3 * lookahead_s,
        "overhead": lookahead_s / prefill_s,
    }


def eval_scores(summary_csv: Path, method: str = "lookaheadkv") -> dict[str, float]:
    """``method``'s scores from an ``lkv eval`` summary: ``eval/<task>/<setting>@<budget>`` for end tasks,
    ``eval/<task>/<metric>`` for importance rows (which carry every metric in one row)."""
    scores = {}
    with summary_csv.open(encoding="utf-8") as rows:
        for row in csv.DictReader(rows):
            if row["method"] != method:
                continue
            if row["budget"] == NO_BUDGET:
                fixed = {"task", "setting", "method", "budget", "n", "score"}
                scores.update(
                    {f"eval/{row['task']}/{k}": float(v) for k, v in row.items() if k not in fixed and v}
                )
            else:
                scores[f"eval/{row['task']}/{row['setting']}@{row['budget']}"] = float(row["score"])
    return scores


def run_point(
    values: dict[str, Any],
    base: dict[str, Any],
    output: Path,
    eval_config: str | None,
    overhead_tokens: int,
    overhead_repeats: int,
    device: str | None,
) -> dict[str, Any]:
    """Fit (in a subprocess), time and optionally evaluate one grid point; write and return its result."""
    name = point_name(values)
    folder = output / "points" / name
    folder.mkdir(parents=True, exist_ok=True)
    fit_values = {k: v for k, v in values.items() if not k.startswith(EVAL_PREFIX)}
    logs = output / "tensorboard" / name
    config_path = folder / "config.yaml"
    config = point_config(base, fit_values, folder, logs)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "lkv.cli", "fit", "--config", str(config_path)]
    last = folder / "checkpoints" / "last.ckpt"
    if last.exists():  # an interrupted fit of this point
        command += ["--ckpt_path", str(last)]
    start = time.perf_counter()
    with (folder / "fit.log").open("a", encoding="utf-8") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    fit_s = time.perf_counter() - start
    if status != 0:
        tail = "\n".join((folder / "fit.log").read_text(encoding="utf-8").splitlines()[-15:])
        raise RuntimeError(
            f"sweep point {name}: `{' '.join(command)}` exited with {status}; log tail:\n{tail}"
        )
    if not last.exists():
        raise FileNotFoundError(f"sweep point {name}: the fit wrote no {last}; see {folder / 'fit.log'}")
    result: dict[str, Any] = {"point": name, "values": values, "fit_s": fit_s}
    result["metrics"] = last_scalars(logs / "fit")
    if overhead_tokens > 0:
        dtype = config["model"].get("dtype", "float32")
        result["cost"] = lookahead_overhead(last, overhead_tokens, overhead_repeats, dtype, device)
    if eval_config is not None:
        args = ["--config", eval_config, "--adapter", str(last), "--output", str(folder / "eval")]
        for key, value in values.items():
            if key.startswith(EVAL_PREFIX):
                args += [f"--{key[len(EVAL_PREFIX) :]}", json.dumps(value)]
        args += ["--progress", "false"] + ([] if device is None else ["--device", device])
        auto_cli(evaluate, args=args, as_positional=False)
        result["metrics"].update(eval_scores(folder / "eval" / "summary.csv"))
    (folder / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


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
# The verb


@contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (a scheduler's pre-emption, ``kill``) into ``SystemExit(143)``.

    Python's default SIGTERM ends the process at once and would leave the running `lkv fit` child
    behind; an exception lets ``subprocess.run`` kill and reap it. The point's atomically written
    ``last.ckpt`` lets a rerun resume it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    out = Path(output)
    results, ran = [], 0
    with _exit_on_sigterm():
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
    write_sessions(results, out / "tensorboard", grid, score)
    summary = write_summary(results, Path(summary_dir or out), grid, score, size_key, group_key)
    return f"lkv sweep: {len(points)} points ({ran} run now, {len(points) - ran} already done); summary: {summary}"
