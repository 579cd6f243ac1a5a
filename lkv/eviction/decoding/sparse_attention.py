"""Attention-time policies: restrict which cached keys a forward pass attends to, without evicting any.

``install_sparse_attention(model)`` routes the model's attention through a wrapper of its current
implementation (which :func:`lkv.core.attention.install_capture` has already wrapped, so captures keep working).
The wrapper is a no-op unless the forward pass is given ``lkv_sparse=policy``; then, in every layer, it asks
``policy.allowed_keys(layer_idx, query, key)`` for a boolean mask ``(batch, heads, q, K)`` (``None``: dense)
and merges it into the layer's attention mask before calling the wrapped implementation. Works with any
implementation that takes a boolean or additive mask per head (sdpa, eager).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from lkv.core.attention import install_capture, merge_mask, wrap_attention

SPARSE_KWARG = "lkv_sparse"
_PREFIX = "lkv_sparse_"


class SparseAttention(Protocol):
    def allowed_keys(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """``(batch, heads, q, K)`` bool (True = may attend) for ``query (batch, heads, q, d)`` on
        ``key (batch, kv_heads, K, d)``, or ``None`` to leave the layer dense."""
        ...


def _make_sparse(implementation: str) -> Callable:
    def sparse_attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs,
    ):
        policy: SparseAttention | None = kwargs.pop(SPARSE_KWARG, None)
        if policy is not None:
            allowed = policy.allowed_keys(module.layer_idx, query, key)
            if allowed is not None:
                attention_mask = merge_mask(attention_mask, allowed, query.dtype)
        return ALL_ATTENTION_FUNCTIONS[implementation](module, query, key, value, attention_mask, **kwargs)

    return sparse_attention


def install_sparse_attention(model: PreTrainedModel) -> str:
    """Route ``model``'s attention through the sparse wrapper (after :func:`install_capture`). Idempotent.

    Returns the new implementation name (``lkv_sparse_<previous>``). Outputs are unchanged unless a forward
    pass is given ``lkv_sparse=...``.
    """
    current = model.config._attn_implementation
    if current.startswith(_PREFIX):
        return current
    install_capture(model)
    return wrap_attention(model, _PREFIX, _make_sparse)
