"""H2O (Zhang et al., 2023): heavy hitters by attention accumulated over every prompt query, plus a recent window."""

from __future__ import annotations

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


class H2OPress(Press):
    """Scores = attention mass of all ``S`` prompt queries (capture in chunks during the prefill).

    Args:
        recent: trailing prompt tokens always kept (H2O's local window; 32 matches SnapKV's window).
    """

    name = "h2o"
    streamable = True

    def __init__(self, recent: int = 32) -> None:
        if recent < 0:
            raise ValueError(f"recent must be ≥ 0, got {recent}")
        self.recent = recent

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture:
        return ImportanceCapture(num_keys=prompt_len)

    def score(self, ctx: PressContext) -> torch.Tensor:
        # The mean over queries ranks exactly like H2O's sum (one positive factor per head).
        return ctx.capture.scores(ctx.model.config.num_hidden_layers)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return ctx.capture.take

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return 0, min(self.recent, prompt_len)
