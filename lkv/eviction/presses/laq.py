"""LAQ (Lookahead Q-Cache, Wang et al., 2025): a pseudo response generated from a SnapKV-compressed cache
supplies the queries that score the full prompt cache.

:class:`PseudoQueryPress` is the part LAQ shares with SpecKV (:mod:`lkv.eviction.presses.speckv`): some draft
process proposes ``n`` pseudo-response tokens; they are teacher-forced through the *target* on top of its
full prompt cache (the cache is cropped back afterwards, so their K/V never reach decoding) and their
attention on the prompt, together with the last ``window`` prompt queries captured during the prefill, ranks
the prompt. The two methods differ only in where the pseudo response comes from.
"""

from __future__ import annotations

import copy
from abc import abstractmethod

import torch

from lkv.core.budget import Budget
from lkv.core.cache import CompressedCache, gather_cache
from lkv.core.generation import crop_to, decode
from lkv.core.importance import response_importance
from lkv.eviction.presses.base import PressContext
from lkv.eviction.presses.snapkv import WindowPress, snapkv_scores
from lkv.eviction.selector import pool_scores, select_indices


class PseudoQueryPress(WindowPress):
    """Scores the prompt with the queries of a short pseudo response plus the last ``window`` prompt queries.

    Every query counts once: with ``A_w`` the window's and ``A_p`` the ``n`` pseudo tokens' normalised
    attention ``(1, layers, kv_heads, S)``, the importance is ``(w·A_w + n·A_p) / (w + n)``. As in SnapKV
    (which both LAQ and SpecKV build on) the prefix before the window is max-pooled (``kernel``), the row is
    renormalised to sum to 1, and the window is always kept (:meth:`protected`).

    Args:
        num_tokens: pseudo-response tokens to generate (fewer if the draft emits EOS).
        window, kernel, pooling: see :class:`~lkv.eviction.presses.snapkv.WindowPress`.
    """

    def __init__(self, num_tokens: int = 8, window: int = 32, kernel: int = 7, pooling: str = "max") -> None:
        super().__init__(window, kernel, pooling)
        if num_tokens <= 0:
            raise ValueError(f"num_tokens must be positive, got {num_tokens}")
        self.num_tokens = num_tokens

    @abstractmethod
    def pseudo_response(self, ctx: PressContext, window_attention: torch.Tensor) -> list[int]:
        """Up to ``num_tokens`` pseudo-response tokens; ``ctx.cache`` must be left at ``S`` entries.

        Args:
            window_attention: ``(1, layers, kv_heads, S)`` normalised attention of the observation window.
        """

    @torch.no_grad()
    def score(self, ctx: PressContext) -> torch.Tensor:
        if ctx.capture is None:
            raise ValueError(
                f"{self.name} scores need the observation-window capture of the prompt's prefill"
            )
        window_attention = ctx.capture.scores(ctx.model.config.num_hidden_layers)
        tokens = self.pseudo_response(ctx, window_attention)
        ids = torch.tensor([tokens], device=ctx.prompt_ids.device)
        pseudo_attention = response_importance(ctx.model, ctx.cache, ctx.prompt_len, ids)[None]
        window = min(self.window, ctx.prompt_len)
        mixed = (window * window_attention + len(tokens) * pseudo_attention) / (window + len(tokens))
        return pooled_window_scores(mixed, window, self.kernel, self.pooling)


def pooled_window_scores(attention: torch.Tensor, window: int, kernel: int, pooling: str) -> torch.Tensor:
    """SnapKV's pooling of the prefix before the last ``window`` positions, renormalised: ``(..., S) → (..., S)``.

    The window's own entries stay as they are (the selector keeps them anyway), unlike
    :func:`~lkv.eviction.presses.snapkv.snapkv_scores`' ``+inf``, so the result is still a distribution.
    """
    split = max(attention.shape[-1] - window, 0)
    pooled = torch.cat([pool_scores(attention[..., :split], kernel, pooling), attention[..., split:]], dim=-1)
    return pooled / pooled.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(pooled.dtype).tiny)


class LAQPress(PseudoQueryPress):
    """LAQ: SnapKV-compress a view of the cache, greedily generate the pseudo response from it, score the full cache.

    The compressed view shares nothing it modifies with the prompt cache (each layer is a shallow copy whose
    tensors are replaced by gathered ones), so the full cache is never copied and stays intact.

    Args:
        draft_budget: tokens per KV head (``int``) or ratio of the prompt (``float``) the SnapKV-compressed
            cache keeps while it generates the pseudo response. The paper uses the eviction budget itself;
            the press does not see that budget, so set both to the same value to reproduce it.
        num_tokens, window, kernel, pooling: see :class:`PseudoQueryPress`.
    """

    name = "laq"

    def __init__(
        self,
        draft_budget: Budget | int | float = 128,
        num_tokens: int = 8,
        window: int = 32,
        kernel: int = 7,
        pooling: str = "max",
    ) -> None:
        super().__init__(num_tokens, window, kernel, pooling)
        self.draft_budget = Budget.of(draft_budget)

    def pseudo_response(self, ctx: PressContext, window_attention: torch.Tensor) -> list[int]:
        budget = self.draft_budget.tokens(ctx.prompt_len)
        window = min(self.window, ctx.prompt_len)
        if budget >= ctx.prompt_len:
            # Nothing to evict: generate on the prompt cache itself, then drop what was appended.
            tokens = decode(
                ctx.model, ctx.cache, ctx.next_logits, ctx.prompt_len, self.num_tokens, ctx.eos_token_ids
            )
            crop_to(ctx.cache, ctx.prompt_len)
            return tokens
        if budget < window:
            raise ValueError(f"LAQ draft_budget {budget} is smaller than its observation window {window}")
        snap = snapkv_scores(window_attention, window, self.kernel, self.pooling)
        kept = select_indices(snap, [budget] * len(ctx.cache.layers))
        view = gather_cache(CompressedCache([copy.copy(layer) for layer in ctx.cache.layers]), kept)
        return decode(ctx.model, view, ctx.next_logits, ctx.prompt_len, self.num_tokens, ctx.eos_token_ids)
