"""StreamingLLM (Xiao et al., 2024): the first ``sink`` tokens plus the most recent ones."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


class StreamingLLMPress(Press):
    """Attention sinks + a recent window filling the rest of the budget.

    Scores rise with position, so after the protected sink the selector keeps the latest ``C - sink`` tokens.
    """

    name = "streamingllm"
    streamable = True

    def __init__(self, sink: int = 4) -> None:
        if sink < 0:
            raise ValueError(f"sink must be ≥ 0, got {sink}")
        self.sink = sink

    def score(self, ctx: PressContext) -> torch.Tensor:
        layer = self._recency(ctx.model.config, ctx.prompt_ids)
        return layer[:, None].expand(1, ctx.model.config.num_hidden_layers, *layer.shape[1:])

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        layer = self._recency(ctx.model.config, ctx.prompt_ids)
        return lambda _: layer

    @staticmethod
    def _recency(config: PretrainedConfig, prompt_ids: torch.Tensor) -> torch.Tensor:
        """``(1, kv_heads, S)``: every position scored by its index."""
        recency = torch.arange(prompt_ids.shape[1], dtype=torch.float32, device=prompt_ids.device)
        return recency.expand(1, config.num_key_value_heads, prompt_ids.shape[1])

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return min(self.sink, prompt_len), 0
