"""TOVA (Oren et al., 2024): the attention of the last prompt query decides what stays."""

from __future__ import annotations

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


class TOVAPress(Press):
    """Scores = last prompt query's attention, averaged over the query heads of each KV group."""

    name = "tova"
    streamable = True

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture:
        return ImportanceCapture(num_keys=prompt_len, last_queries=1)

    def score(self, ctx: PressContext) -> torch.Tensor:
        return ctx.capture.scores(ctx.model.config.num_hidden_layers)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return ctx.capture.take
