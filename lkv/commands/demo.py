"""`lkv demo`: the embedded default end to end — assets → label → fit → export → eval → report — on a CPU.

    lkv demo --config configs/demo/smollm2_135m.yaml        (what `make demo` runs)

Every stage reuses what a previous run left: assets are cached, label folders resume, an exported adapter is
kept (unless ``refit``), and the evaluation resumes its ``results.jsonl``. Each stage's wall time, CPU time
and the machine's load average are printed and written at the top of the report.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from lkv.core.progress import minutes
from lkv.labels.builtin_prompts import BuiltinPrompts


class StageClock:
    """Wall time, CPU time and 1-minute load average (before → after) of named stages.

    The CPU time (this process's, all its threads) is the stage's work whatever else shares the machine: on
    a loaded machine the wall time stretches, the CPU time much less, so it is the column to compare runs by.
    """

    def __init__(self) -> None:
        self.stages: list[tuple[str, float, float, float, float]] = []
        self.start, self.start_cpu = time.perf_counter(), time.process_time()

    def run(self, name: str, action: Callable[[], Any]) -> Any:
        before = os.getloadavg()[0]
        print(f"lkv demo: {name} …", flush=True)
        started, started_cpu = time.perf_counter(), time.process_time()
        result = action()
        seconds, cpu = time.perf_counter() - started, time.process_time() - started_cpu
        after = os.getloadavg()[0]
        self.stages.append((name, seconds, cpu, before, after))
        print(
            f"lkv demo: {name} took {minutes(seconds)}, CPU {minutes(cpu)} (load average {before:.1f} → "
            f"{after:.1f})",
            flush=True,
        )
        return result

    def table(self) -> list[str]:
        lines = [
            "| stage | wall time | CPU time | load average (1 min) before → after |",
            "|---|---:|---:|---|",
        ]
        for name, seconds, cpu, before, after in self.stages:
            lines.append(f"| {name} | {minutes(seconds)} | {minutes(cpu)} | {before:.1f} → {after:.1f} |")
        total, total_cpu = time.perf_counter() - self.start, time.process_time() - self.start_cpu
        lines.append(f"| **total** | **{minutes(total)}** | **{minutes(total_cpu)}** | |")
        return lines


def fit_config(train_config: str, labels: Path, output: Path, max_epochs: int | None) -> dict[str, Any]:
    """The training recipe ``train_config`` pointed at the demo's labels and folders.

    Data → ``labels/{train,heldout}``; TensorBoard → ``output/tensorboard/fit``; checkpoints →
    ``output/fit/checkpoints``; ``max_epochs`` overridden when given. Everything else is the recipe's.
    """
    path = Path(train_config)
    if not path.is_file():
        raise FileNotFoundError(f"train_config {path}: no such file")
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict) or not {"model", "trainer", "data"} <= set(config):
        raise ValueError(f"{path}: expected a LightningCLI config with model, trainer and data sections")
    trainer = config["trainer"]
    config["data"] = {**config["data"], "train": str(labels / "train"), "val": str(labels / "heldout")}
    trainer["default_root_dir"] = str(output / "fit")
    trainer["logger"] = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(output / "tensorboard"), "name": "fit", "default_hp_metric": False},
    }
    if max_epochs is not None:
        trainer["max_epochs"] = max_epochs
    checkpoints = [
        c for c in trainer.get("callbacks", []) if c.get("class_path", "").endswith("ModelCheckpoint")
    ]
    if len(checkpoints) != 1:
        raise ValueError(f"{path}: expected exactly one ModelCheckpoint callback, found {len(checkpoints)}")
    checkpoints[0].setdefault("init_args", {})
    checkpoints[0]["init_args"].update({"dirpath": str(output / "fit" / "checkpoints"), "save_last": True})
    return config


def eval_arguments(
    eval_config: str, output: Path, adapter: Path, heldout: Path, title: str
) -> dict[str, Any]:
    """``lkv eval`` arguments from ``eval_config``, writing to ``output`` with the demo's adapter and labels.

    Every :class:`~lkv.eval.tasks.ImportanceTask` of the suite is pointed at the demo's held-out labels.
    """
    from jsonargparse import ActionConfigFile, ArgumentParser

    from lkv.commands.eval import evaluate

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(evaluate)
    config = parser.parse_args(["--config", eval_config])
    for task in config.tasks:
        if task.class_path.endswith("ImportanceTask"):
            task.init_args.folder = str(heldout)
    config.output, config.adapter, config.title = str(output), str(adapter), title
    instantiated = parser.instantiate(config)
    return {k: v for k, v in vars(instantiated).items() if k != "config"}


TRACE_FILE = "cache_lengths.json"


def cache_length_section(
    adapter: Path, out: Path, budget: int, max_new_tokens: int, progress: bool = True
) -> list[str]:
    """Cache length over one long generation per method (LookaheadKV alone and with H2O upkeep, the
    decode-time methods, FullKV): ``out/cache_lengths.json`` (reused when it holds generations of this
    length), a plot in ``out/plots/`` and the report's markdown lines."""
    from lkv.eval.tasks.text import HeldoutEssays
    from lkv.eval.trace import cache_length_traces, plot_cache_lengths
    from lkv.eviction.compressor import Compressor
    from lkv.eviction.decoding import H2ODecode
    from lkv.eviction.presses.lookaheadkv import load_lookahead
    from lkv.eviction.roles import REFERENCE

    path = out / TRACE_FILE
    traces = json.loads(path.read_text()) if path.is_file() else {}
    if not traces or any(len(lengths) != max_new_tokens for lengths in traces.values()):
        model, tokenizer, lookahead = load_lookahead(str(adapter))
        essay = " ".join(s.text for s in HeldoutEssays(tokenizer).take(1000, start=0))
        request = f"{essay}\n\nRetell the text above in detail, paragraph by paragraph."
        compressors = {
            REFERENCE: Compressor(model, tokenizer, REFERENCE),
            "lookaheadkv": Compressor(model, tokenizer, lookahead, budget),
            "lookaheadkv+h2o": Compressor(
                model, tokenizer, lookahead, budget, decode_policy=H2ODecode(every=16)
            ),
            **{m: Compressor(model, tokenizer, m, budget) for m in ("h2o-decode", "scissorhands", "quest")},
        }
        traces = cache_length_traces(compressors, request, max_new_tokens, progress)
        path.write_text(json.dumps(traces))
    title = f"~1000-token held-out essay, {max_new_tokens} generated tokens, budget {budget}"
    plot = plot_cache_lengths(traces, budget, out / "plots" / "cache_length.png", title)
    lines = [
        f"## Cache length over a {max_new_tokens}-token generation",
        "",
        "Entries per KV head (the most any layer holds) before decoding, at the peak and at the end; EOS "
        "ignored. Prefill-only methods grow by one entry per token; decode-time eviction stays at the budget "
        "(`lookaheadkv+h2o`: LookaheadKV at prefill, H2O upkeep every 16 tokens); Quest keeps the full cache "
        "and attends to at most the budget.",
        "",
        "| method | after prefill | peak | end |",
        "|---|---:|---:|---:|",
        *(f"| {m} | {t[0]} | {max(t)} | {t[-1]} |" for m, t in traces.items()),
        "",
        f"![cache length](plots/{plot.name})",
        "",
    ]
    return lines


def demo(
    output: str = "reports/demo",
    labels: str = "data/labels/demo",
    train_prompts: int = 64,
    heldout_prompts: int = 16,
    min_words: int = 600,
    max_words: int = 800,
    response_tokens: int = 64,
    max_prompt_tokens: int = 1024,
    label_batch_size: int = 8,
    label_mode: Literal["aware", "agnostic"] = "aware",
    train_config: str = "configs/smollm2_135m.yaml",
    max_epochs: int | None = None,
    eval_config: str = "configs/eval/demo.yaml",
    refit: bool = False,
    trace_tokens: int = 64,
    trace_budget: int = 128,
    progress: bool = True,
) -> str:
    """Label → fit → export → eval on the embedded SmolLM2-135M-Instruct, then write a report folder.

    Args:
        output: report folder (report.md, summary.csv, plots/, tensorboard/, results.jsonl, the fitted
            adapter and the exact training config used).
        labels: label root; ``train/`` and ``heldout/`` are created (or resumed) under it.
        train_prompts: built-in training prompts (essays + standard-library code, train documents only).
        heldout_prompts: built-in held-out prompts (validation and the importance benchmark).
        min_words: shortest prompt passage, in words.
        max_words: longest prompt passage, in words.
        response_tokens: R, response tokens per label.
        max_prompt_tokens: prompt length limit of the labels.
        label_batch_size: prompts labelled together (``lkv label --batch_size``; same labels as 1, faster).
        label_mode: ``aware`` or ``agnostic`` (``lkv label --label_mode``: a module for question-agnostic
            compression, labelled one prompt at a time; evaluate it with ``settings: [agnostic]``).
        train_config: LightningCLI training recipe (its data paths, logger and checkpoint folder are redirected).
        max_epochs: override the recipe's epochs.
        eval_config: ``lkv eval`` suite (output, adapter and importance labels are set by the demo); the
            demo's own is small enough for its time, ``configs/eval/default.yaml`` runs every method.
        refit: train again even when ``output/adapter`` exists (its old results are discarded).
        trace_tokens: length of the generation whose cache length per method the report plots (0: none).
        trace_budget: eviction budget of that generation.
        progress: show progress bars.
    """
    import torch

    from lkv.commands.eval import evaluate
    from lkv.commands.label import label
    from lkv.eval.report import write_report
    from lkv.eval.results import RESULTS_FILE, ResultsFile
    from lkv.model import assets

    out, label_root = Path(output), Path(labels)
    adapter = out / "adapter"
    clock = StageClock()
    print(f"lkv demo: report folder {out}, labels {label_root}; load average {os.getloadavg()[0]:.1f}")
    clock.run("assets (fetch if missing)", assets.fetch_all)
    for split, count in (("train", train_prompts), ("heldout", heldout_prompts)):
        prompts = BuiltinPrompts(split=split, num_prompts=count, min_words=min_words, max_words=max_words)
        clock.run(
            f"label {split} ({count} prompts, R={response_tokens})",
            lambda split=split, prompts=prompts: label(
                output=str(label_root / split),
                prompts=prompts,
                response_tokens=response_tokens,
                max_prompt_tokens=max_prompt_tokens,
                truncation="middle",
                batch_size=label_batch_size,
                label_mode=label_mode,
                progress=progress,
            ),
        )
    if refit or not adapter.is_dir():
        fit_adapter(fit_config(train_config, label_root, out, max_epochs), out, refit, clock)
    else:
        print(f"lkv demo: reusing the adapter in {adapter} (pass --refit true to train again)")
    title = "LookaheadKV on SmolLM2-135M-Instruct (lkv demo)"
    arguments = eval_arguments(eval_config, out, adapter, label_root / "heldout", title)
    arguments["progress"] = progress
    clock.run("eval", lambda: evaluate(**arguments))
    trace = []
    if trace_tokens > 0:
        trace = clock.run(
            f"cache length over a {trace_tokens}-token generation",
            lambda: cache_length_section(adapter, out, trace_budget, trace_tokens, progress),
        )
    rows = ResultsFile(out / RESULTS_FILE).rows
    notes = [
        f"Made by `lkv demo` (eval suite `{eval_config}`, training recipe `{train_config}`); wall and CPU "
        f"times on this machine ({os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads):",
        "",
        *clock.table(),
    ]
    report = write_report(rows, out, title=title, methods=arguments["methods"], notes=notes, appendix=trace)
    print("\n".join(["", *clock.table(), ""]))
    return f"lkv demo: report at {report}"


def fit_adapter(config: dict[str, Any], out: Path, refit: bool, clock: StageClock) -> None:
    """Fit the lookahead module of ``config`` into ``out``/fit and export it to ``out``/adapter; the results of
    an earlier adapter in ``out`` go. A fit of this very recipe that stopped before its adapter was exported
    continues from its last checkpoint; ``refit`` or a changed recipe starts over."""
    from lkv.commands.export import export
    from lkv.eval.results import RESULTS_FILE, RUN_FILE
    from lkv.train.cli import lightning_main

    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "fit.yaml"
    text = yaml.safe_dump(config, sort_keys=False)
    # The last checkpoint, not the best by validation recall: the validation labels are also the
    # importance benchmark's, and choosing on them would flatter LookaheadKV there.
    last = out / "fit" / "checkpoints" / "last.ckpt"
    resume = not refit and last.is_file() and config_path.is_file() and config_path.read_text() == text
    if not resume:
        shutil.rmtree(out / "fit" / "checkpoints", ignore_errors=True)
        config_path.write_text(text)
    command = ["fit", "--config", str(config_path), *(["--ckpt_path", str(last)] if resume else [])]
    clock.run(f"fit ({config_path}{', resumed' if resume else ''})", lambda: lightning_main(command))
    clock.run("export adapter", lambda: export(str(last), str(out / "adapter")))
    for stale in (RESULTS_FILE, RUN_FILE, TRACE_FILE):  # results of an earlier adapter
        (out / stale).unlink(missing_ok=True)
