"""StreamingLLM (Xiao et al., 2024): the first ``sink`` tokens plus the most recent ones."""

from __future__ import annotations

import torch

from lkv.eviction.presses.base import Press, PressContext


class StreamingLLMPress(Press):
    """Attention sinks + a recent window filling the rest of the budget.

    Scores rise with position, so after the protected sink the selector keeps the latest ``C - sink`` tokens.
    """

    name = "streamingllm"

    def __init__(self, sink: int = 4) -> None:
        if sink < 0:
            raise ValueError(f"sink must be ≥ 0, got {sink}")
        self.sink = sink

    def score(self, ctx: PressContext) -> torch.Tensor:
        config = ctx.model.config
        recency = torch.arange(ctx.prompt_len, dtype=torch.float32, device=ctx.prompt_ids.device)
        return recency.expand(1, config.num_hidden_layers, config.num_key_value_heads, ctx.prompt_len)

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return min(self.sink, prompt_len), 0
