"""TOVA (Oren et al., 2024): the attention of the last prompt query decides what stays."""

from __future__ import annotations

from typing import Literal

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext

TOVARanking = Literal["layer", "kv_group"]


class TOVAPress(Press):
    """Scores = the last prompt query's attention on the prompt.

    Args:
        ranking: ``"layer"`` (the paper's, default): averaged over all query heads of the layer, one ranking
            shared by every KV head of the layer, as in the paper and kvpress's ``TOVAPress``;
            ``"kv_group"``: averaged over the query heads of each GQA group, one ranking per KV head.
    """

    name = "tova"
    streamable = True

    def __init__(self, ranking: TOVARanking = "layer") -> None:
        if ranking not in ("layer", "kv_group"):
            raise ValueError(f"TOVA ranking must be 'layer' or 'kv_group', got {ranking!r}")
        self.ranking = ranking

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture:
        return ImportanceCapture(num_keys=prompt_len, last_queries=1)

    def score(self, ctx: PressContext) -> torch.Tensor:
        return self._rank(ctx.capture.scores(ctx.model.config.num_hidden_layers))

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return lambda layer: self._rank(ctx.capture.take(layer))

    def _rank(self, group_scores: torch.Tensor) -> torch.Tensor:
        """``(..., kv_heads, S)`` per-group means → the chosen ranking, same shape.

        One query's attention sums to 1 over the prompt in every head, so each group row is that group's mean
        attention and the mean over the (equal-sized) groups is the mean over all query heads.
        """
        if self.ranking == "kv_group":
            return group_scores
        return group_scores.mean(dim=-2, keepdim=True).expand_as(group_scores)
