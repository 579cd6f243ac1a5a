"""Quest (Tang et al., 2024): query-aware page selection at every decoding step. It saves no memory.

The cache is cut into pages of ``page_size`` consecutive entries; a page is summarised by the per-channel
minimum ``m`` and maximum ``M`` of its keys. For a decoding query ``q`` the largest logit any key of the
page can reach is bounded by ``Σ_i max(q_i m_i, q_i M_i)``; each query head attends only to the ``k`` pages
with the largest bounds (the current page — which holds the step's own token — always among them), with
``k = budget // page_size``. Every entry stays in memory: Quest is a retrieval baseline that cuts the keys
and values *read* per step, not the cache.

Implemented as an attention-time mask (:mod:`lkv.eviction.decoding.sparse_attention`): the unselected pages are
masked out of the dense attention, which is exact with respect to Quest's selection but does none of its
memory-traffic saving. Page summaries are kept per layer and extended as pages fill up (the cache only grows
while Quest decodes), so a step costs two ``pages × d`` products per head on top of the attention. As in the
reference implementation, prefill (and an appended question) attends densely, and the first
``dense_layers`` layers stay dense.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.eviction.decoding.base import DecodePolicy, DecodeStart, Upkeep
from lkv.eviction.decoding.sparse_attention import SPARSE_KWARG, install_sparse_attention


def page_summaries(key: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel minimum and maximum of each page's keys.

    Args:
        key: ``(batch, kv_heads, K, d)``; page ``p`` holds entries ``p·page_size .. (p+1)·page_size - 1`` (the
            last page may be partial).

    Returns:
        ``(low, high)``, each ``(batch, kv_heads, pages, d)`` in fp32.
    """
    k_len = key.shape[2]
    full = k_len // page_size * page_size
    keys = key.float()
    lows, highs = [], []
    if full:
        pages = keys[:, :, :full].unflatten(2, (full // page_size, page_size))
        lows.append(pages.amin(3))
        highs.append(pages.amax(3))
    if full < k_len:
        lows.append(keys[:, :, full:].amin(2, keepdim=True))
        highs.append(keys[:, :, full:].amax(2, keepdim=True))
    return torch.cat(lows, dim=2), torch.cat(highs, dim=2)


def page_bounds(query: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Quest's upper bound of each page's logits: ``Σ_i max(q_i · low_i, q_i · high_i)`` (unscaled).

    Since ``low ≤ high``, the maximum is ``q_i · high_i`` where ``q_i ≥ 0`` and ``q_i · low_i`` elsewhere: two
    products of ``pages × d``.

    Args:
        query: ``(batch, heads, d)``, one query per head (the query heads of a GQA group share a KV head).
        low, high: ``(batch, kv_heads, pages, d)`` from :func:`page_summaries`.

    Returns:
        ``(batch, heads, pages)``.
    """
    batch, heads, head_dim = query.shape
    grouped = query.float().view(batch, low.shape[1], heads // low.shape[1], head_dim)
    bound = grouped.clamp(min=0) @ high.transpose(-1, -2) + grouped.clamp(max=0) @ low.transpose(-1, -2)
    return bound.reshape(batch, heads, -1)


class QuestAttention(DecodePolicy):
    """Each decoding step attends to the top ``budget // page_size`` pages of keys per query head.

    Args:
        budget: tokens attended per step and head (default: the prompt's compression budget); at least the
            current page is read.
        page_size: entries per page (paper: 16).
        dense_layers: leading layers left dense (reference implementation: 2).
    """

    name = "quest"

    def __init__(self, budget: int | None = None, page_size: int = 16, dense_layers: int = 2) -> None:
        super().__init__(budget)
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"quest: page_size must be a whole number ≥ 1, got {page_size!r}")
        if isinstance(dense_layers, bool) or not isinstance(dense_layers, int) or dense_layers < 0:
            raise ValueError(f"quest: dense_layers must be a whole number ≥ 0, got {dense_layers!r}")
        self.page_size = page_size
        self.dense_layers = dense_layers

    def begin(self, model: PreTrainedModel, cache: DynamicCache, start: DecodeStart) -> QuestUpkeep:
        install_sparse_attention(model)
        caps = self.caps(start, len(cache.layers))
        return QuestUpkeep(self, caps, [max(1, cap // self.page_size) for cap in caps])


class QuestUpkeep(Upkeep):
    """One generation under Quest: the per-step page selection, handed to the sparse-attention wrapper."""

    def __init__(self, policy: QuestAttention, caps: list[int], pages: list[int]) -> None:
        super().__init__(caps)
        self.policy = policy
        self.pages = pages
        # Per layer: (low, high) summaries of the pages that were already full, and how many entries they cover.
        self._summaries: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._seen: set[int] = set()
        self._sparse = False  # whether the last forward pass was meant to be sparse

    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        self._seen, self._sparse = set(), generating
        return {SPARSE_KWARG: self} if generating else {}

    def summaries(self, layer_idx: int, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(low, high)`` of every page of ``key (batch, kv_heads, K, d)``, the full pages summarised once."""
        size, k_len = self.policy.page_size, key.shape[2]
        low, high, covered = self._summaries.get(layer_idx, (None, None, 0))
        if covered > k_len:  # not the cache these pages were taken from: start over
            low, high, covered = None, None, 0
        full = k_len // size * size
        if full > covered:
            new_low, new_high = page_summaries(key[:, :, covered:full], size)
            low = new_low if low is None else torch.cat([low, new_low], dim=2)
            high = new_high if high is None else torch.cat([high, new_high], dim=2)
            covered = full
            self._summaries[layer_idx] = (low, high, covered)
        if full == k_len:
            return low, high
        tail_low, tail_high = page_summaries(key[:, :, full:], size)
        if low is None:
            return tail_low, tail_high
        return torch.cat([low, tail_low], dim=2), torch.cat([high, tail_high], dim=2)

    def allowed_keys(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """``(batch, heads, 1, K)`` keys of the selected pages (see :class:`~lkv.eviction.decoding.sparse_attention.SparseAttention`)."""
        self._seen.add(layer_idx)
        if query.shape[2] != 1 or layer_idx < self.policy.dense_layers:
            return None
        bound = page_bounds(query[:, :, 0], *self.summaries(layer_idx, key))
        bound[..., -1] = math.inf  # the current page: it holds this step's own token
        top = bound.topk(min(self.pages[layer_idx], bound.shape[-1]), dim=-1).indices
        chosen = torch.zeros_like(bound, dtype=torch.bool).scatter_(-1, top, True)
        return chosen.repeat_interleave(self.policy.page_size, dim=-1)[..., None, : key.shape[2]]

    def observe(self) -> None:
        if not self._sparse:
            return  # a dense block (an appended question)
        missing = sorted(set(range(len(self.caps))) - self._seen)
        if missing:
            raise RuntimeError(
                f"quest was not applied to layers {missing}: the model's attention no longer goes through "
                "lkv.eviction.decoding.sparse_attention (was its attention implementation reset?)"
            )
