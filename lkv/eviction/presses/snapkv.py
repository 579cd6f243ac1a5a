"""SnapKV: the last ``window`` prompt queries vote for the prefix, with 1-D pooling; the window is kept."""

from __future__ import annotations

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.presses.base import (
    LayerScorer,
    Press,
    PressContext,
    StreamContext,
)
from lkv.eviction.selector import check_pooling, pool_scores


def snapkv_scores(
    window_attention: torch.Tensor, window: int, kernel: int = 7, pooling: str = "max"
) -> torch.Tensor:
    """SnapKV's ranking from the observation window's attention.

    Args:
        window_attention: ``(..., S)`` attention of the last ``window`` queries on the prompt (any scale).
        window: observation window size; its positions get ``+inf`` (always kept).
        kernel, pooling: 1-D pooling over the prefix (paper: 7, max; :data:`~lkv.eviction.selector.POOLING_MODES`).

    Returns:
        ``(..., S)`` scores: pooled prefix attention, ``+inf`` on the window.
    """
    prompt_len = window_attention.shape[-1]
    split = max(prompt_len - window, 0)
    prefix = pool_scores(window_attention[..., :split], kernel, pooling)
    inf = torch.full_like(window_attention[..., split:], float("inf"))
    return torch.cat([prefix, inf], dim=-1)


class WindowPress(Press):
    """A press that reads the attention of the last ``window`` prompt queries (captured in the prefill), pools
    the prefix's scores and always keeps the window: SnapKV, PyramidKV and the pseudo-query presses (LAQ,
    SpecKV) built on it.

    Args:
        window: observation window of prompt queries (SnapKV's 32).
        kernel, pooling: 1-D pooling of the prefix scores (odd kernel; 1 = none;
            :data:`~lkv.eviction.selector.POOLING_MODES`).
    """

    def __init__(self, window: int = 32, kernel: int = 7, pooling: str = "max") -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        check_pooling(kernel, pooling)
        self.window = window
        self.kernel = kernel
        self.pooling = pooling

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture:
        return ImportanceCapture(num_keys=prompt_len, last_queries=self.window)

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return 0, min(self.window, prompt_len)


class SnapKVPress(WindowPress):
    """SnapKV (Li et al., 2024); defaults are the paper settings: window 32, max-pool kernel 7.

    ``pooling="avg_zero_pad"`` pools as NVIDIA kvpress's ``SnapKVPress`` does (its kept sets equal lkv's
    then; docs/kvpress.md); ``"avg"`` does not penalise the prefix's edge tokens for the zero padding.
    """

    name = "snapkv"
    streamable = True

    def score(self, ctx: PressContext) -> torch.Tensor:
        attention = ctx.capture.scores(ctx.model.config.num_hidden_layers)
        return snapkv_scores(attention, self.window, self.kernel, self.pooling)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return lambda layer: snapkv_scores(ctx.capture.take(layer), self.window, self.kernel, self.pooling)
