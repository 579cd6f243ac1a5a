"""Side-by-side timing of variants (interleaved repetitions, medians, paired differences) and a linear fit of
costs against the prompt length.

Used by `lkv bench` and by the cost figures of a sweep and of an in-run ablation (:mod:`lkv.perf.overhead`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lkv.core.clock import clock


def _nothing() -> None:
    return None


@dataclass
class Case:
    """One variant of a benchmark at one size, set up and ready to run.

    Attributes:
        run: the measured work; may return extra figures (e.g. ``{"eviction_s": ...}``) to record per run.
        reset: untimed preparation before every run (e.g. a fresh copy of a cache that decoding grows).
        info: fixed figures of the case (e.g. KV bytes of its cache).
    """

    run: Callable[[], dict[str, float] | None]
    reset: Callable[[], None] = _nothing
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timings:
    """Per-variant seconds and extra figures of every measured repetition (warm-ups excluded).

    Attributes:
        seconds: variant → wall seconds of each repetition, in repetition order.
        extras: variant → figure name → values per repetition (whatever ``Case.run`` returned).
    """

    seconds: dict[str, list[float]]
    extras: dict[str, dict[str, list[float]]]

    def median(self, variant: str) -> float:
        return statistics.median(self.seconds[variant])

    def paired_difference(self, variant: str, reference: str) -> float:
        """Median over repetitions of ``variant − reference`` seconds (both ran back to back each time)."""
        pairs = zip(self.seconds[variant], self.seconds[reference], strict=True)
        return statistics.median(a - b for a, b in pairs)

    def extra_median(self, variant: str, name: str) -> float:
        return statistics.median(self.extras[variant][name])


def time_interleaved(cases: dict[str, Case], repeats: int, warmup: int, device: torch.device) -> Timings:
    """Run every case ``warmup + repeats`` times, one round of all variants after another.

    Interleaving spreads slow drifts of a shared machine (other jobs, thermal state) over all variants alike;
    the order inside a round rotates so that no variant always runs first (right after another's cleanup).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats ≥ 1 and warmup ≥ 0, got repeats={repeats}, warmup={warmup}")
    names = list(cases)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    extras: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            case = cases[name]
            case.reset()
            start = clock(device)
            extra = case.run()
            elapsed = clock(device) - start
            if round_ < warmup:
                continue
            seconds[name].append(elapsed)
            for key, value in (extra or {}).items():
                extras[name].setdefault(key, []).append(float(value))
    return Timings(seconds, extras)


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least-squares ``y ≈ slope·x + intercept`` and the largest relative residual ``max |y − fit| / y``."""
    if len(xs) < 2:
        return {"slope": float("nan"), "intercept": float("nan"), "max_rel_residual": float("nan")}
    slope, intercept = statistics.linear_regression(xs, ys)
    residual = max(abs(y - (slope * x + intercept)) / abs(y) for x, y in zip(xs, ys, strict=True) if y)
    return {"slope": slope, "intercept": intercept, "max_rel_residual": residual}
