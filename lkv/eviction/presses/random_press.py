"""Random eviction: the floor every method should beat."""

from __future__ import annotations

import torch

from lkv.eviction.presses.base import Press, PressContext


class RandomPress(Press):
    """Uniform random scores from a seeded generator (the same prompt length gives the same selection)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def score(self, ctx: PressContext) -> torch.Tensor:
        config = ctx.model.config
        generator = torch.Generator().manual_seed(self.seed)
        return torch.rand(
            1, config.num_hidden_layers, config.num_key_value_heads, ctx.prompt_len, generator=generator
        )
