"""PyramidKV (Cai et al., 2024): SnapKV scores, budgets shrinking with depth, the same total."""

from __future__ import annotations

from lkv.eviction.presses.snapkv import SnapKVPress


def pyramid_budgets(budget: int, prompt_len: int, num_layers: int, window: int, beta: int = 20) -> list[int]:
    """PyramidKV's per-layer budgets: an arithmetic sequence from layer 0 down to the last layer.

    As in the reference implementation, each layer keeps its ``window`` plus a share of the rest that falls
    linearly from ``max`` to ``min = (C - window) // beta`` with ``max + min = 2 (C - window)``; ``max`` is
    capped at ``S - window`` (then ``min`` rises to keep the sum). Rounding uses largest remainders so the
    total is exactly ``num_layers · C``.
    """
    if budget >= prompt_len:
        return [prompt_len] * num_layers
    if budget < window:
        raise ValueError(f"PyramidKV budget {budget} is smaller than its observation window {window}")
    share = budget - window
    if num_layers == 1 or share == 0:
        return [budget] * num_layers
    low = share // beta
    high = min(2 * share - low, prompt_len - window)
    low = 2 * share - high
    exact = [high - layer * (high - low) / (num_layers - 1) for layer in range(num_layers)]
    shares = [int(value) for value in exact]
    by_remainder = sorted(range(num_layers), key=lambda layer: (shares[layer] - exact[layer], layer))
    for layer in by_remainder[: num_layers * share - sum(shares)]:
        shares[layer] += 1
    return [window + value for value in shares]


class PyramidKVPress(SnapKVPress):
    """SnapKV's scores and window; layer ``l`` keeps :func:`pyramid_budgets` tokens per head.

    Args:
        beta: ratio of the widest to the narrowest layer's share (reference default 20).
    """

    name = "pyramidkv"

    def __init__(self, window: int = 32, kernel: int = 7, pooling: str = "max", beta: int = 20) -> None:
        super().__init__(window, kernel, pooling)
        if beta < 1:
            raise ValueError(f"beta must be ≥ 1, got {beta}")
        self.beta = beta

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        return pyramid_budgets(budget, prompt_len, num_layers, min(self.window, prompt_len), self.beta)
