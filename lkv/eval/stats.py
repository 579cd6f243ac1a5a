"""Intervals and paired tests for evaluation cells, in pure Python (no SciPy in the environment).

- :func:`wilson_interval`: 95 % Wilson score interval of an accuracy (k successes of n).
- :func:`bootstrap_interval`: percentile bootstrap interval of a mean of continuous scores.
- :func:`stratified_bootstrap_interval`: the same for a mean of group means (a benchmark's average over tasks).
- :func:`mcnemar_exact`: exact (binomial) two-sided McNemar test of two methods' paired 0/1 outcomes.
- :func:`paired_difference_interval`: Newcombe's 95 % interval of the difference of paired 0/1 accuracies.
- :func:`paired_bootstrap`: percentile interval and two-sided p-value of the mean paired difference.

Everything is deterministic: bootstraps draw from a generator seeded by the caller (default 0), so a report
rebuilt from the same rows prints the same numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # two-sided 95 % quantile of the standard normal
BOOTSTRAP_DRAWS = 2000
ALPHA = 0.05


def is_binary(values: Sequence[float]) -> bool:
    """True when every value is exactly 0 or 1 (an accuracy, which gets Wilson intervals and McNemar)."""
    return all(v in (0.0, 1.0) for v in values)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` of a proportion ``successes / n``, both in ``[0, 1]``.

    Unlike the normal (Wald) interval it stays inside ``[0, 1]`` and is not empty at 0/n or n/n, which is
    where small evaluation cells usually sit.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n={n}], got {successes}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # Exact 0 and 1 at the ends (the formula gives them up to rounding).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (NumPy's default) of already sorted values, ``q`` in ``[0, 1]``."""
    position = q * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    return sorted_values[below] + (sorted_values[above] - sorted_values[below]) * (position - below)


def _bootstrap_means(values: Sequence[float], draws: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    n = len(values)
    return sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(draws))


def bootstrap_interval(
    values: Sequence[float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of the mean of ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("bootstrap_interval needs at least one value")
    means = _bootstrap_means(list(values), draws, seed)
    tail = (1 - level) / 2
    return _percentile(means, tail), _percentile(means, 1 - tail)


def stratified_bootstrap_interval(
    groups: Sequence[Sequence[float]], draws: int = BOOTSTRAP_DRAWS, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of the mean of the groups' means (each group weighs the
    same, as a benchmark's average over its tasks): every draw resamples each group within itself, with
    replacement, so a group of few samples keeps its weight and its own spread."""
    if not groups or not all(groups):
        raise ValueError("stratified_bootstrap_interval needs at least one group, each with a value")
    rng = random.Random(seed)
    averages = sorted(
        sum(sum(rng.choice(group) for _ in group) / len(group) for group in groups) / len(groups)
        for _ in range(draws)
    )
    tail = (1 - level) / 2
    return _percentile(averages, tail), _percentile(averages, 1 - tail)


def mean_interval(values: Sequence[float], binary: bool | None = None, seed: int = 0) -> tuple[float, float]:
    """95 % interval of a cell's mean: Wilson for an accuracy, bootstrap otherwise.

    Args:
        binary: whether the scores are an accuracy (default: whether every value is 0 or 1). Give it when
            the task decides: a continuous metric's cell that happens to hold only 0s and 1s is no accuracy.
    """
    if binary is None:
        binary = is_binary(values)
    if binary:
        if not is_binary(values):
            raise ValueError("binary=True needs scores that are all 0 or 1")
        return wilson_interval(round(sum(values)), len(values))
    return bootstrap_interval(values, seed=seed)


def binomial_two_sided(k: int, n: int) -> float:
    """Exact two-sided p-value of ``k`` successes in ``n`` fair coin flips: ``min(1, 2·P(X ≤ min(k, n−k)))``."""
    if n == 0:
        return 1.0
    low = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedResult:
    """A paired comparison of method A against method B on the same samples.

    Attributes:
        n: paired samples.
        diff: mean of A − B (score scale, e.g. 0.25 = 25 points).
        low, high: 95 % interval of ``diff``: the percentile bootstrap, or for 0/1 outcomes Newcombe's
            square-and-add interval for paired proportions (:func:`paired_difference_interval`).
        wins: samples where A scored higher than B.
        losses: samples where B scored higher than A.
        p: two-sided p-value (exact McNemar for 0/1 scores, paired bootstrap otherwise).
        test: ``mcnemar`` or ``bootstrap``.
    """

    n: int
    diff: float
    low: float
    high: float
    wins: int
    losses: int
    p: float
    test: str

    @property
    def significant(self) -> bool:
        """The difference is outside noise at the 5 % level."""
        return self.p < ALPHA


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> PairedResult:
    """Exact McNemar test of paired 0/1 outcomes: only discordant pairs count, ``wins ~ Bin(wins+losses, ½)``."""
    _check_pairs(a, b)
    if not (is_binary(a) and is_binary(b)):
        raise ValueError("mcnemar_exact needs 0/1 outcomes; use paired_bootstrap for continuous scores")
    wins = sum(x > y for x, y in zip(a, b, strict=True))
    losses = sum(x < y for x, y in zip(a, b, strict=True))
    both = sum(x == y == 1 for x, y in zip(a, b, strict=True))
    neither = len(a) - both - wins - losses
    low, high = paired_difference_interval(both, wins, losses, neither)
    return PairedResult(
        len(a),
        (wins - losses) / len(a),
        low,
        high,
        wins,
        losses,
        binomial_two_sided(wins, wins + losses),
        "mcnemar",
    )


def paired_difference_interval(
    both: int, first_only: int, second_only: int, neither: int, z: float = Z95
) -> tuple[float, float]:
    """95 % interval of ``p1 − p2`` for paired 0/1 outcomes (p1 = first right, p2 = second right): Newcombe's
    square-and-add interval (method 10 of Newcombe 1998, Stat. Med. 17:2635), from the Wilson intervals of p1
    and p2 and the phi coefficient of the 2×2 table.

    It accounts for the uncertainty in how many pairs are discordant; an interval built from the discordant
    share alone (Wilson on wins / (wins + losses)) covers as little as ~60 % when one side rarely wins, and its
    far end equals the estimate when it never does.
    """
    counts = (both, first_only, second_only, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise ValueError(f"need non-negative counts of a non-empty 2×2 table, got {counts}")
    n = sum(counts)
    first, second = both + first_only, both + second_only
    p1, p2 = first / n, second / n
    low1, high1 = wilson_interval(first, n, z)
    low2, high2 = wilson_interval(second, n, z)
    margins = first * (n - first) * second * (n - second)
    cross = both * neither - first_only * second_only
    # phi with Newcombe's continuity correction: a positive cross product is shrunk by n/2 (not below 0)
    cross = max(cross - n / 2, 0.0) if cross > 0 else cross
    phi = cross / math.sqrt(margins) if margins else 0.0
    diff = p1 - p2
    below = (p1 - low1) ** 2 - 2 * phi * (p1 - low1) * (high2 - p2) + (high2 - p2) ** 2
    above = (high1 - p1) ** 2 - 2 * phi * (high1 - p1) * (p2 - low2) + (p2 - low2) ** 2
    return max(-1.0, diff - math.sqrt(max(below, 0.0))), min(1.0, diff + math.sqrt(max(above, 0.0)))


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> PairedResult:
    """Paired bootstrap of the mean difference ``a − b``: resample samples (pairs), keep their pairing.

    The two-sided p-value is twice the share of resampled means on the far side of zero (at least
    ``1 / draws`` when every resample agrees in sign, so it never reads as exactly 0).
    """
    _check_pairs(a, b)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    means = _bootstrap_means(diffs, draws, seed)
    mean = sum(diffs) / len(diffs)
    if all(d == 0 for d in diffs):
        p = 1.0
    else:
        beyond = sum(m <= 0 for m in means) if mean > 0 else sum(m >= 0 for m in means)
        p = min(1.0, 2 * max(beyond, 1) / draws)
    return PairedResult(
        len(diffs),
        mean,
        _percentile(means, 0.025),
        _percentile(means, 0.975),
        sum(d > 0 for d in diffs),
        sum(d < 0 for d in diffs),
        p,
        "bootstrap",
    )


def paired_test(a: Sequence[float], b: Sequence[float], seed: int = 0) -> PairedResult:
    """Exact McNemar when both sides are 0/1 outcomes, else the paired bootstrap."""
    if is_binary(a) and is_binary(b):
        return mcnemar_exact(a, b)
    return paired_bootstrap(a, b, seed=seed)


def _check_pairs(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b) or not a:
        raise ValueError(f"paired tests need two equally long, non-empty samples, got {len(a)} and {len(b)}")
