"""H2O (Zhang et al., 2023): heavy hitters by attention accumulated over every prompt query, plus a recent window."""

from __future__ import annotations

from typing import Literal

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext

H2OAccumulation = Literal["sum", "visible_mean"]


class H2OPress(Press):
    """Scores = attention mass of all ``S`` prompt queries (capture in chunks during the prefill).

    Args:
        recent: trailing prompt tokens always kept (H2O's local window; 32 matches SnapKV's window).
        accumulate: ``"sum"`` (the paper's accumulated attention, default) or ``"visible_mean"``: each key's
            sum divided by the ``S − j`` causal queries that can see key ``j``, as kvpress's
            ``ObservedAttentionPress`` scores (it no longer favours early keys for being seen more often).
    """

    name = "h2o"
    streamable = True

    def __init__(self, recent: int = 32, accumulate: H2OAccumulation = "sum") -> None:
        if recent < 0:
            raise ValueError(f"recent must be ≥ 0, got {recent}")
        if accumulate not in ("sum", "visible_mean"):
            raise ValueError(f"H2O accumulate must be 'sum' or 'visible_mean', got {accumulate!r}")
        self.recent = recent
        self.accumulate = accumulate

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture:
        return ImportanceCapture(num_keys=prompt_len)

    def score(self, ctx: PressContext) -> torch.Tensor:
        # The mean over queries ranks exactly like H2O's sum (one positive factor per head).
        return self._accumulate(ctx.capture.scores(ctx.model.config.num_hidden_layers))

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return lambda layer: self._accumulate(ctx.capture.take(layer))

    def _accumulate(self, scores: torch.Tensor) -> torch.Tensor:
        """``(..., S)`` attention mass → the chosen accumulation, same shape."""
        if self.accumulate == "sum":
            return scores
        prompt_len = scores.shape[-1]
        visible = torch.arange(prompt_len, 0, -1, device=scores.device, dtype=scores.dtype)
        return scores / visible

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return 0, min(self.recent, prompt_len)
