"""FullKV: no eviction, the reference every method is compared against."""

from __future__ import annotations

import torch

from lkv.eviction.presses.base import Press, PressContext


class FullKVPress(Press):
    """Keeps the whole prompt whatever the budget."""

    name = "fullkv"

    def score(self, ctx: PressContext) -> torch.Tensor:
        config = ctx.model.config
        return torch.zeros(1, config.num_hidden_layers, config.num_key_value_heads, ctx.prompt_len)

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        return [prompt_len] * num_layers
