"""``lkv bench``: side-by-side speed and memory of lkv's hot paths against their baselines.

The sub-benchmarks (``--which``) are the suites of :mod:`lkv.perf.suites`, one module each: ``train-step``,
``ttft``, ``label``, ``decode``, ``prefill-memory``; and ``train-memory`` (only when named; ``--model
random:<architecture>``), the peak memory of the two-phase step at real shapes without its arithmetic
(:mod:`lkv.perf.shape_memory`). Each suite measures all its variants at each prompt length in one process,
interleaved, ``repeats`` times after ``warmup`` rounds (:func:`lkv.perf.timing.time_interleaved`); this
module times them, adds peak memory where the suite asks for it, and prints the suite's table.

Peak memory follows :mod:`lkv.perf.memory`: CUDA allocator statistics on a GPU, one fresh subprocess per
measurement on the CPU. Prompts are seeded random token ids; generations never stop early (no EOS), so
every variant does the same amount of work.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.perf import shape_memory
from lkv.perf.memory import cuda_peak_bytes, subprocess_peak_bytes
from lkv.perf.suites import SUITES
from lkv.perf.suites.base import MIB, Measured
from lkv.perf.timing import Case, Timings, time_interleaved
from lkv.perf.workbench import BenchSettings, Workbench

BENCHMARKS = tuple(SUITES)
# run only when named (not by --which all): needs --model random:<architecture>
TRAIN_MEMORY = "train-memory"
TRAIN_MEMORY_LENGTHS = (4096, 8192, 16384)


def build_case(bench: Workbench, which: str, variant: str, length: int) -> Case:
    """``which``'s ``variant`` at ``length`` tokens, built on ``bench``.

    Raises:
        ValueError: naming the sub-benchmark's variants when it has no ``variant``.
    """
    suite = SUITES[which]
    if variant not in suite.variants(bench.settings):
        raise ValueError(f"{which} has no variant {variant!r}; it has {suite.variants(bench.settings)}")
    return suite.case(bench, variant, length)


def memory_case(which: str, variant: str, length: int, settings: dict[str, Any]) -> Case:
    """Entry point of the CPU memory subprocess: one case, built from scratch."""
    return build_case(
        Workbench(BenchSettings(**settings), share_model=SUITES[which].one_model), which, variant, length
    )


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _measure_length(
    bench: Workbench, which: str, length: int, repeats: int, warmup: int, memory: bool, threads: int
) -> dict[str, Any]:
    """All variants of ``which`` at one prompt length: timings, extras, peak memory (or the error)."""
    device = bench.device
    cases: dict[str, Case] = {}
    failed: dict[str, str] = {}
    suite = SUITES[which]
    for variant in suite.variants(bench.settings, length):
        try:
            cases[variant] = build_case(bench, which, variant, length)
            if device.type == "cuda":  # find variants that do not fit before timing the others
                cases[variant].reset()
                cases[variant].run()
        except RuntimeError as error:
            if not _is_oom(error):
                raise
            cases.pop(variant, None)
            failed[variant] = "out of memory"
        if variant in failed:  # outside the handler, whose traceback still holds the failed run's tensors
            torch.cuda.empty_cache()
    timings = time_interleaved(cases, repeats, warmup, device) if cases else Timings({}, {})
    out: dict[str, Any] = {}
    for variant in suite.variants(bench.settings, length):
        if variant in failed:
            out[variant] = {"error": failed[variant]}
            continue
        entry: dict[str, Any] = {"seconds": timings.seconds[variant], "median_s": timings.median(variant)}
        entry.update({f"median_{k}": timings.extra_median(variant, k) for k in timings.extras[variant]})
        entry.update(cases[variant].info)
        if memory and suite.measures_memory:
            if device.type == "cuda":
                entry["peak_bytes"] = cuda_peak_bytes(cases[variant], device)
            else:
                settings = suite.memory_settings(asdict(bench.settings), variant)
                kwargs = {"which": which, "variant": variant, "length": length, "settings": settings}
                entry.update(subprocess_peak_bytes("lkv.perf.bench:memory_case", kwargs, threads))
        out[variant] = entry
    reference = suite.reference(bench.settings)
    if reference in cases:
        for variant in cases:
            if variant != reference:
                out[variant]["minus_reference_s"] = timings.paired_difference(variant, reference)
    return out


def derive(which: str, settings: BenchSettings, lengths: dict[int, Measured]) -> dict[Any, Any]:
    """The suite's figures per length, plus its figures across lengths (string keys)."""
    suite = SUITES[which]
    derived: dict[Any, Any] = {n: suite.derive(settings, n, measured) for n, measured in lengths.items()}
    return {**derived, **suite.derive_across(settings, lengths)}


def markdown(which: str, result: dict[str, Any]) -> str:
    """A table of one sub-benchmark's result (the ``benchmarks[which]`` part of the JSON), its failed
    variants and its line fits."""
    head, rows = SUITES[which].table(result)
    for length, measured in result["lengths"].items():
        for variant, entry in measured.items():
            if "error" in entry:
                rows.append([length, f"{variant}: {entry['error']}"] + [""] * (len(head) - 2))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    for key, fit in result["derived"].items():
        if key.endswith("_peak_vs_length"):
            sign = "+" if fit["intercept"] >= 0 else "−"
            lines.append(
                f"\n{key.removesuffix('_peak_vs_length')} peak memory ≈ {fit['slope'] / 1024:.1f} KiB/token × S "
                f"{sign} {abs(fit['intercept']) / MIB:.0f} MiB (largest deviation from the line "
                f"{100 * fit['max_rel_residual']:.1f} %)"
            )
    return "\n".join(lines)


def environment(threads: int, device: torch.device) -> dict[str, Any]:
    """Machine and software facts recorded with every result."""
    import transformers

    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["lkv", *sys.argv[1:]]) if sys.argv[0].endswith("lkv") else " ".join(sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        names = (
            [
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ]
            if cpuinfo.is_file()
            else []
        )
        info["cpu"] = names[0] if names else platform.processor()
    return info


def _check_counts(
    lengths: list[int] | dict[str, list[int]] | None, repeats: int, warmup: int, threads: int | None
) -> None:
    """Refuse, before any model loads, a prompt length under 1 token, no measured repetition, a negative
    warm-up or under 1 thread; the message names the option as the user wrote it."""
    per_name = lengths.items() if isinstance(lengths, dict) else [("", lengths or [])]
    for name, sizes in per_name:
        bad = [n for n in sizes if n < 1]
        if bad:
            where = f"--lengths.{name}" if name else "--lengths"
            raise ValueError(f"{where}: expected prompt lengths of at least 1 token, found {bad}")
    for option, value, least in (
        ("--repeats", repeats, 1),
        ("--warmup", warmup, 0),
        ("--threads", threads, 1),
    ):
        if value is not None and value < least:
            raise ValueError(f"{option}: expected a whole number ≥ {least}, found {value}")


def run_benchmarks(
    selected: list[str],
    settings: BenchSettings,
    lengths: list[int] | dict[str, list[int]] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    memory: bool = True,
) -> dict[str, Any]:
    """Run the ``selected`` sub-benchmarks (see :func:`lkv.commands.bench.bench`), print their tables, return all results."""
    unknown = [name for name in selected if name not in (*BENCHMARKS, TRAIN_MEMORY)]
    if unknown:
        raise ValueError(
            f"--which: unknown sub-benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}, "
            f"{TRAIN_MEMORY} or all"
        )
    if isinstance(lengths, dict):
        extra = sorted(set(lengths) - set(selected))
        if extra:
            raise ValueError(f"--lengths names sub-benchmarks {extra} that --which does not select")
    _check_counts(lengths, repeats, warmup, threads)
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    # one model in memory, not two, when no selected suite compares the plain model with the lookahead one
    workbench = Workbench(settings, share_model=all(SUITES[n].one_model for n in selected if n in SUITES))
    # the settings' device, not the model's: asking the model would load it (train-memory never does)
    device = torch.device(settings.device or "cpu")
    results: dict[str, Any] = {"environment": environment(threads, device), "benchmarks": {}}
    for name in selected:
        defaults = TRAIN_MEMORY_LENGTHS if name == TRAIN_MEMORY else SUITES[name].default_lengths
        sizes = lengths.get(name, defaults) if isinstance(lengths, dict) else lengths or defaults
        if name == TRAIN_MEMORY:

            def on_model(model: PreTrainedModel) -> Workbench:
                return Workbench(settings, model=model, share_model=True)

            result = {"settings": asdict(settings), **shape_memory.measure(settings, sorted(sizes), on_model)}
            results["benchmarks"][name] = result
            print(f"\n## {name} ({settings.model}, {settings.dtype}, fake tensors)\n")
            print(shape_memory.markdown(result), flush=True)
            continue
        measured = {
            str(n): _measure_length(workbench, name, n, repeats, warmup, memory, threads)
            for n in sorted(sizes)
        }
        derived = derive(name, settings, {int(n): m for n, m in measured.items()})
        result = {
            "settings": asdict(settings),
            "repeats": repeats,
            "warmup": warmup,
            "lengths": measured,
            "derived": {str(k): v for k, v in derived.items()},
        }
        results["benchmarks"][name] = result
        print(f"\n## {name} ({settings.model}, {settings.dtype}, {workbench.device}, {threads} threads)\n")
        print(markdown(name, result), flush=True)
    results["environment"]["load_average_end"] = os.getloadavg()
    return results
