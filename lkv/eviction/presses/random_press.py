"""Random eviction: the floor every method should beat."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


class RandomPress(Press):
    """Uniform random scores from a seeded generator (the same prompt length gives the same selection)."""

    name = "random"
    streamable = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def score(self, ctx: PressContext) -> torch.Tensor:
        return self._draw(ctx.model.config, ctx.prompt_len)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        # one draw for all layers, as in score(): the same seed must give the same selection either way
        scores = self._draw(ctx.model.config, ctx.prompt_len)
        return lambda layer: scores[:, layer]

    def _draw(self, config: PretrainedConfig, prompt_len: int) -> torch.Tensor:
        """``(1, layers, kv_heads, S)`` uniform scores from this press's seed."""
        generator = torch.Generator().manual_seed(self.seed)
        return torch.rand(
            1, config.num_hidden_layers, config.num_key_value_heads, prompt_len, generator=generator
        )
