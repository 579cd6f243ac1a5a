"""The few transformers APIs that changed between the releases lkv supports (5.2 and later), in one place.

Everything else in lkv calls transformers directly. What differs:

- **The cache keyword of a forward pass.** 5.24 renamed ``past_key_values`` to ``cache`` (the old name still
  works there, with a deprecation warning, until 5.40); before 5.24 a ``cache=`` keyword is swallowed by
  ``**kwargs`` and silently ignored, so the model would run without any cache. :func:`cache_kwargs` gives the
  keyword this release reads.
- **A causal mask sized from one layer.** 5.24's ``create_causal_mask`` takes the ``layer_idx`` whose length
  sizes the mask; older releases size it from the first full-attention layer and need ``cache_position``.
  Layer-streamed eviction has earlier layers already cut to their budgets, so :func:`layer_causal_mask`
  hands older releases a view of the cache holding that one layer.
- **GGUF dequantization.** ``GgufConfig`` arrived in 5.17; older releases have no GGUF quantizer and always
  load a ``.gguf`` file as plain dense weights, which is what :func:`gguf_dense_kwargs` asks newer ones for.

The kvpress integration (``lkv.integrations.kvpress``) runs on transformers 5.2 because kvpress 0.5.5 pins
``transformers<5.3``; ``make test-lowest`` runs the fast tests on the lowest releases pyproject allows.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import transformers
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

# the forward keyword that carries the KV cache (5.24+: ``cache``, before: ``past_key_values``)
CACHE_KWARG: str = (
    "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
)
_MASK_TAKES_LAYER = "layer_idx" in inspect.signature(create_causal_mask).parameters


def cache_kwargs(cache: object) -> dict[str, Any]:
    """``{keyword: cache}`` for a model or decoder-layer forward call of the installed transformers."""
    return {CACHE_KWARG: cache}


def layer_causal_mask(
    config: transformers.PretrainedConfig,
    inputs_embeds: torch.Tensor,
    cache: DynamicCache,
    position_ids: torch.Tensor,
    layer_idx: int,
) -> torch.Tensor | None:
    """The causal mask of a block appended after layer ``layer_idx``'s cache entries, sized from that layer.

    Args:
        config: the decoder's config (its attention implementation picks the mask format).
        inputs_embeds: ``(1, Q, hidden)`` the block's hidden states.
        cache: the cache; layer ``layer_idx`` holds the ``K`` entries the block attends to besides itself.
        position_ids: ``(1, Q)`` the block's positions.

    Returns:
        what the layer's attention expects: ``None`` (plain causal), a boolean or additive
        ``(1, 1, Q, K + Q)`` mask.
    """
    if _MASK_TAKES_LAYER:
        return create_causal_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=None,
            **cache_kwargs(cache),
            position_ids=position_ids,
            layer_idx=layer_idx,
        )
    # Before 5.24 the mask is sized from the first layer; show it a cache whose only layer is this one.
    view = copy.copy(cache)
    view.layers = [cache.layers[layer_idx]]
    # the block's cache slots, not its RoPE positions (they may run ahead: a lookahead position offset)
    seen = view.layers[0].get_seq_length()
    return create_causal_mask(
        config=config,
        inputs_embeds=inputs_embeds,
        attention_mask=None,
        cache_position=torch.arange(seen, seen + inputs_embeds.shape[1], device=inputs_embeds.device),
        past_key_values=view,
        position_ids=position_ids,
    )


def mask_query_length(query: int | torch.Tensor) -> int:
    """The block length a cache's ``get_mask_sizes`` is asked about: an ``int`` in newer transformers, the
    block's ``cache_position`` ``(Q,)`` in older ones."""
    return query.shape[0] if isinstance(query, torch.Tensor) else int(query)


def gguf_dense_kwargs() -> dict[str, Any]:
    """``from_pretrained`` keywords that load a ``.gguf`` file as dense weights with no quantizer left."""
    if hasattr(transformers, "GgufConfig"):
        return {"quantization_config": transformers.GgufConfig(dequantize=True)}
    return {}  # before 5.17 GGUF files always load dequantized
