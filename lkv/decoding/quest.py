"""Quest (Tang et al., 2024): query-aware page selection at every decoding step. It saves no memory.

The cache is cut into pages of ``page_size`` consecutive entries; a page is summarised by the per-channel
minimum ``m`` and maximum ``M`` of its keys. For a decoding query ``q`` the largest logit any key of the
page can reach is bounded by ``Σ_i max(q_i m_i, q_i M_i)``; each query head attends only to the ``k`` pages
with the largest bounds (the current page — which holds the step's own token — always among them), with
``k = budget // page_size``. Every entry stays in memory: Quest is a retrieval baseline that cuts the keys
and values *read* per step, not the cache.

Implemented as an attention-time mask (:mod:`lkv.decoding.sparse_attention`): the page bounds are computed
from the layer's keys at each step and the unselected pages are masked out of the dense attention, which is
exact with respect to Quest's selection but does none of its memory-traffic saving. As in the reference
implementation, prefill (and an appended question) attends densely, and the first ``dense_layers`` layers
stay dense.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from lkv.decoding.base import DecodePolicy, DecodeStart, Upkeep
from lkv.decoding.sparse_attention import SPARSE_KWARG, install_sparse_attention


def page_bounds(query: torch.Tensor, key: torch.Tensor, page_size: int) -> torch.Tensor:
    """Quest's upper bound of each page's logits.

    Args:
        query: ``(batch, heads, d)``, one query per head.
        key: ``(batch, kv_heads, K, d)``; page ``p`` holds entries ``p·page_size .. (p+1)·page_size - 1``.

    Returns:
        ``(batch, heads, pages)``: ``Σ_i max(q_i · min_i, q_i · max_i)`` over the page's keys (unscaled).
    """
    batch, heads, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    pages = math.ceil(k_len / page_size)
    pad = pages * page_size - k_len
    keys = key.float()
    low = (
        F.pad(keys, (0, 0, 0, pad), value=math.inf).view(batch, kv_heads, pages, page_size, head_dim).amin(3)
    )
    high = (
        F.pad(keys, (0, 0, 0, pad), value=-math.inf).view(batch, kv_heads, pages, page_size, head_dim).amax(3)
    )
    grouped = query.float().view(
        batch, kv_heads, heads // kv_heads, 1, head_dim
    )  # heads of a group share keys
    bound = torch.maximum(grouped * low[:, :, None], grouped * high[:, :, None]).sum(-1)
    return bound.reshape(batch, heads, pages)


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
        self._seen: set[int] = set()
        self._sparse = False  # whether the last forward pass was meant to be sparse

    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        self._seen, self._sparse = set(), generating
        return {SPARSE_KWARG: self} if generating else {}

    def allowed_keys(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """``(batch, heads, 1, K)`` keys of the selected pages (see :class:`~lkv.decoding.sparse_attention.SparseAttention`)."""
        self._seen.add(layer_idx)
        if query.shape[2] != 1 or layer_idx < self.policy.dense_layers:
            return None
        size = self.policy.page_size
        bound = page_bounds(query[:, :, 0], key, size)
        bound[..., -1] = math.inf  # the current page: it holds this step's own token
        top = bound.topk(min(self.pages[layer_idx], bound.shape[-1]), dim=-1).indices
        chosen = torch.zeros_like(bound, dtype=torch.bool).scatter_(-1, top, True)
        return chosen.repeat_interleave(size, dim=-1)[..., None, : key.shape[2]]

    def observe(self) -> None:
        if not self._sparse:
            return  # a dense block (an appended question)
        missing = sorted(set(range(len(self.caps))) - self._seen)
        if missing:
            raise RuntimeError(
                f"quest was not applied to layers {missing}: the model's attention no longer goes through "
                "lkv.decoding.sparse_attention (was its attention implementation reset?)"
            )
