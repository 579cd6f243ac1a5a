"""H2O while decoding (Zhang et al., 2023): heavy hitters by accumulated attention plus a recent window.

Every query — each prompt token during the prefill, then each generated token — adds its attention to the
keys it sees; after each step the cache keeps, per layer and KV head, the most recent entries and the
entries with the largest accumulated attention ("heavy hitters"), evicting the rest. Per KV head, the
attention of the query heads of its GQA group is averaged (as everywhere in lkv).
"""

from __future__ import annotations

import torch

from lkv.eviction.decoding.base import DecodeStart, EvictionPolicy


class H2ODecode(EvictionPolicy):
    """H2O's eviction rule, applied at every decoding step.

    The accumulators of the prompt's entries start from the prefill method's scores read as the mean
    attention of the ``S`` prompt queries (``S · score``): for the ``h2o`` press, whose scores are exactly
    that mean, this continues H2O's own prefill accumulation; for other methods it is a prior on the same
    scale (``+inf`` marks of always-kept windows count as the row's largest finite score; no scores → 0).

    Args:
        budget: entries per KV head (default: the prompt's compression budget).
        every: evict every ``every`` generated tokens (H2O: 1).
        recent: most recent entries always kept: a count or a fraction of the budget (default 0.5: equal
            heavy-hitter and recent budgets, as in H2O's experiments).
    """

    name = "h2o-decode"

    def initial_state(
        self, start: DecodeStart, layer: int, positions: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        if start.scores is None:
            return {"attention": torch.zeros(positions.shape, device=positions.device)}
        seed = start.scores[0, layer].to(positions.device).float().gather(-1, positions[0])
        finite = torch.isfinite(seed)
        largest = seed.masked_fill(~finite, 0.0).amax(dim=-1, keepdim=True)
        seed = torch.where(torch.isposinf(seed), largest, seed.masked_fill(~finite, 0.0))
        return {"attention": (start.prompt_len * seed).clamp_min(0.0)[None]}

    def update(self, state: dict[str, torch.Tensor], rows: torch.Tensor) -> None:
        state["attention"] += rows.sum(dim=2)

    def priority(self, state: dict[str, torch.Tensor], steps: int) -> torch.Tensor:
        return state["attention"]
