"""Oracle: the ground truth s_GT of the model's own full-cache answer (an upper bound, not a method)."""

from __future__ import annotations

import torch

from lkv.core.generation import crop_to, decode
from lkv.core.importance import response_importance
from lkv.eviction.presses.base import Press, PressContext


class OraclePress(Press):
    """Greedily answers with the full cache, then scores the prompt with that answer's attention.

    Args:
        response_tokens: longest answer generated for scoring (paper labels: 512).
    """

    name = "oracle"

    def __init__(self, response_tokens: int = 128) -> None:
        if response_tokens <= 0:
            raise ValueError(f"response_tokens must be positive, got {response_tokens}")
        self.response_tokens = response_tokens

    def score(self, ctx: PressContext) -> torch.Tensor:
        response = decode(
            ctx.model, ctx.cache, ctx.next_logits, ctx.prompt_len, self.response_tokens, ctx.eos_token_ids
        )
        crop_to(ctx.cache, ctx.prompt_len)
        ids = torch.tensor([response], device=ctx.prompt_ids.device)
        return response_importance(ctx.model, ctx.cache, ctx.prompt_len, ids)[None]
