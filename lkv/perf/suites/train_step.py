"""``train-step``: the two-phase step of :mod:`lkv.train.module` vs the naive full-sequence step.

The naive step (:mod:`lkv.perf.naive_step`) is one forward + backward over prompt + lookahead tokens with a
per-token LoRA mask, in two variants: ``naive`` (sdpa + lkv's row capture, the strongest naive step) and
``naive-eager`` (eager attention with ``output_attentions``, measured up to ``eager_max_length``): seconds
per step and peak memory.
"""

from __future__ import annotations

import warnings
from typing import Any

from lkv.perf.naive_step import naive_loss
from lkv.perf.suites.base import MIB, Measured, Suite, fmt, ratio, timed, value
from lkv.perf.timing import Case
from lkv.perf.workbench import BenchSettings, Workbench

NAIVE = {"naive": "", "naive-eager": "_eager"}  # variant → suffix of its derived figures


class TrainStep(Suite):
    name = "train-step"
    default_lengths = (1024, 2048, 4096)
    measures_memory = True

    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        eager = length is None or length <= settings.eager_max_length
        return ["two-phase", "naive"] + (["naive-eager"] if eager else [])

    def reference(self, settings: BenchSettings) -> str:
        return "naive"

    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        ids, target = bench.prompt(length), bench.target(length)
        params = list(bench.lookahead.trainable_parameters().values())

        def reset() -> None:
            for param in params:
                param.grad = None

        if variant in NAIVE:
            attention = "eager" if variant == "naive-eager" else "capture"
            return Case(
                run=lambda: naive_loss(bench.lookahead, ids, target, attention).backward(), reset=reset
            )
        module = bench.training_module
        sample = {"id": "bench", "prompt_ids": ids[0], "response_ids": ids[0, :0], "scores": target}

        def two_phase() -> None:
            with warnings.catch_warnings():  # self.log() without a Trainer warns and does nothing
                warnings.simplefilter("ignore")
                loss = module.training_step([sample], 0)
            loss.backward()

        return Case(run=two_phase, reset=reset)

    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        derived: dict[str, Any] = {}
        if not timed(measured["two-phase"]):
            return derived
        for variant, suffix in NAIVE.items():
            if timed(measured.get(variant, {})):
                derived["speedup" + suffix] = (
                    measured[variant]["median_s"] / measured["two-phase"]["median_s"]
                )
                if "peak_bytes" in measured[variant]:
                    derived["memory_ratio" + suffix] = (
                        measured[variant]["peak_bytes"] / measured["two-phase"]["peak_bytes"]
                    )
        return derived

    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        head = [
            "S",
            "two-phase s/step",
            "naive s/step",
            "speed-up",
            "two-phase peak MiB",
            "naive peak MiB",
            "memory ratio",
            "naive-eager s/step",
            "speed-up (eager)",
            "naive-eager peak MiB",
            "memory ratio (eager)",
        ]
        rows = []
        for length, measured in result["lengths"].items():
            d = result["derived"][length]

            rows.append(
                [
                    length,
                    fmt(value(measured, "two-phase", "median_s")),
                    fmt(value(measured, "naive", "median_s")),
                    ratio(d.get("speedup")),
                    fmt(value(measured, "two-phase", "peak_bytes"), MIB, 0),
                    fmt(value(measured, "naive", "peak_bytes"), MIB, 0),
                    ratio(d.get("memory_ratio")),
                    fmt(value(measured, "naive-eager", "median_s")),
                    ratio(d.get("speedup_eager")),
                    fmt(value(measured, "naive-eager", "peak_bytes"), MIB, 0),
                    ratio(d.get("memory_ratio_eager")),
                ]
            )
        return head, rows
