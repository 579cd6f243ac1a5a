"""A linear fit of costs against the prompt length (the interleaved timer itself is :mod:`lkv.core.timing`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least-squares ``y ≈ slope·x + intercept`` and the largest relative residual ``max |y − fit| / y``."""
    if len(xs) < 2:
        return {"slope": float("nan"), "intercept": float("nan"), "max_rel_residual": float("nan")}
    slope, intercept = statistics.linear_regression(xs, ys)
    residual = max(abs(y - (slope * x + intercept)) / abs(y) for x, y in zip(xs, ys, strict=True) if y)
    return {"slope": slope, "intercept": intercept, "max_rel_residual": residual}
