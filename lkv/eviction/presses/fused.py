"""Fused: one ranking from several presses that each predict the same importance distribution.

LookaheadKV and the per-token probe are both trained against the answer's attention ``s_GT`` (a distribution
over the prompt per layer and KV head) but see different things: the lookahead tokens read the question, the
probe reads each token alone, so each may keep tokens the other loses. Two rules combine them (:data:`RULES`):

- ``mixture``: each part's scores normalised to sum to 1 over the prompt per (layer, KV head), averaged with
  the weights, then pooled. The ensemble estimate of ``s_GT``: a token ranks high when the parts agree.
- ``union``: each part ranks the prompt on its own (pooled as it pools alone); a token's fused score is its
  best rank over the parts, each rank divided by the part's weight, so the top ``C`` is the union of each
  part's top tokens, part ``i`` contributing in proportion to ``w_i`` (equal weights: the same number each).
  A token that one part ranks high and the other does not keeps its place; under ``mixture`` it is halved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import get_args

import torch

from lkv.core.attention import AttentionCapture
from lkv.eviction.names import FusionRule
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext
from lkv.eviction.selector import check_pooling, pool_scores, union

RULES: tuple[str, ...] = get_args(FusionRule)
"""How :class:`FusedPress` combines its parts' scores (module docstring)."""


def check_rule(rule: str) -> None:
    """Raise a clear error unless ``rule`` is one of :data:`RULES`."""
    if rule not in RULES:
        raise ValueError(f"fusion rule must be one of {', '.join(RULES)}; got {rule!r}")


def as_distribution(scores: torch.Tensor) -> torch.Tensor:
    """``(..., S)`` non-negative scores → the same shape, each row summing to 1 (an all-zero row stays 0)."""
    return scores / scores.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


class FusedPress(Press):
    """Scores ``(1, layers, kv_heads, S)``: ``mixture`` = pool(Σ_i w_i · normalise(scores_i)); ``union`` =
    max_i(−rank_i / w_i) (module docstring).

    Args:
        parts: presses whose scores are non-negative (importance distributions; for ``mixture`` unpooled, as
            the fusion pools); at most one of them may ask for a prefill capture (the one prefill has one
            capture per press); none may rank by the budget (a sentence share wraps the fusion instead).
        weights: one per part, non-negative, summing to 1.
        kernel, pooling: 1-D pooling of the fused scores (:data:`~lkv.eviction.selector.POOLING_MODES`).
        rule: ``mixture`` or ``union``.
    """

    name = "fused"

    def __init__(
        self,
        parts: Sequence[Press],
        weights: Sequence[float],
        kernel: int = 1,
        pooling: str = "max",
        rule: FusionRule = "mixture",
    ) -> None:
        if len(parts) < 2 or len(weights) != len(parts):
            raise ValueError(
                f"a fusion needs ≥ 2 presses and one weight each; got {len(parts)} and {len(weights)}"
            )
        if min(weights) < 0 or abs(sum(weights) - 1) > 1e-6:
            raise ValueError(f"fusion weights must be non-negative and sum to 1, got {list(weights)}")
        check_rule(rule)
        check_pooling(kernel, pooling)
        ranked_per_budget = [
            part.name for part in parts if type(part).budget_scores is not Press.budget_scores
        ]
        if ranked_per_budget:
            raise ValueError(
                f"{ranked_per_budget} rank by the budget (Press.budget_scores), which a fusion of their scores "
                "would drop: fuse their inner presses and wrap the fusion instead"
            )
        self.parts = list(parts)
        self.weights = [float(w) for w in weights]
        self.rule = rule
        self.kernel = kernel
        self.pooling = pooling
        self.streamable = all(part.streamable for part in parts)
        self._captured: int | None = None  # the part the prefill capture belongs to (set by prefill_capture)

    def prefill_capture(self, prompt_len: int) -> AttentionCapture | None:
        captures = [(i, part.prefill_capture(prompt_len)) for i, part in enumerate(self.parts)]
        captures = [(i, c) for i, c in captures if c is not None]
        if len(captures) > 1:
            names = [self.parts[i].name for i, _ in captures]
            raise ValueError(f"fused presses share one prefill capture; {names} each ask for one")
        self._captured = captures[0][0] if captures else None
        return captures[0][1] if captures else None

    def _own(self, ctx: PressContext | StreamContext, index: int) -> PressContext | StreamContext:
        """``ctx`` as part ``index`` must see it: the prefill capture only for the part that asked for it."""
        return ctx if index == self._captured else dataclasses.replace(ctx, capture=None)

    def _fuse(self, scores: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.rule == "mixture":
            fused = sum(w * as_distribution(s.float()) for w, s in zip(self.weights, scores, strict=True))
        else:
            fused = union(scores, self.weights)
        return pool_scores(fused, self.kernel, self.pooling)

    def score(self, ctx: PressContext) -> torch.Tensor:
        return self._fuse([part.score(self._own(ctx, i)) for i, part in enumerate(self.parts)])

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        if not self.streamable:
            return super().layer_scorer(ctx)
        scorers = [part.layer_scorer(self._own(ctx, i)) for i, part in enumerate(self.parts)]
        return lambda layer: self._fuse([scorer(layer) for scorer in scorers])

    def protected(self, prompt_len: int) -> tuple[int, int]:
        sinks, recents = zip(*(part.protected(prompt_len) for part in self.parts), strict=True)
        return max(sinks), max(recents)
