"""Physical KV-cache compression: gather the kept positions so the K/V tensors really shrink.

After :func:`gather_cache`, layer ``l`` holds ``(1, kv_heads, C_l, head_dim)`` keys and values, the kept
positions in their original order; layers may differ (PyramidKV). RoPE is already baked into the cached keys,
so decoding only needs position ids that continue from the uncompressed prompt length.

Heads of one layer may keep different counts (AdaKV's head-adaptive budgets,
:func:`lkv.eviction.selector.select_indices`): a layer is then gathered to its largest head's count
``W_l``, and the shorter heads' padding slots (position ``-1`` in the kept index) hold zeros and are marked
in a key mask, ``(batch, kv_heads, W_l)`` bool on the cache layer (:func:`key_mask`; entries appended later
are never masked). Attention skips the masked slots (:func:`lkv.core.attention.install_capture` routes every
forward pass over such a cache through the mask), so the result equals attention over each head's own
kept entries.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from lkv.core.compat import mask_query_length

# Attribute of a cache layer holding its key mask: ``(batch, kv_heads, W)`` bool, True = a real entry.
KEY_MASK_ATTR = "lkv_key_mask"


class CompressedCache(DynamicCache):
    """A :class:`DynamicCache` whose layers may hold different numbers of entries.

    transformers builds one attention mask per forward, sized from the first layer
    (``get_mask_sizes(q, layer_idx=0)``). That is right whenever all layers have the same length. When they
    differ, a single query (decoding) may attend to every cached key in every layer, so the mask is sized
    ``1 × 1`` and broadcasts over each layer's own key count (sdpa needs no mask for one query anyway; eager
    adds it). A block of several queries would need a different causal mask per layer, which transformers
    cannot express: that raises, and callers append such blocks one token at a time.
    """

    def __init__(self, layers: list) -> None:
        Cache.__init__(self, layers=layers)

    @property
    def is_ragged(self) -> bool:
        """True when layers hold different numbers of entries."""
        return len({layer.get_seq_length() for layer in self.layers}) > 1

    def get_mask_sizes(self, query_length: int | torch.Tensor, layer_idx: int) -> tuple[int, int]:
        # older transformers (5.3) pass the block's cache_position here (lkv.core.compat.mask_query_length)
        if not self.is_ragged:
            return super().get_mask_sizes(query_length, layer_idx)
        if mask_query_length(query_length) > 1:
            raise ValueError(
                f"this compressed cache holds {self.layer_lengths()} entries per layer; a block of "
                f"{mask_query_length(query_length)} tokens would need a different causal mask per layer: append "
                "one token at a time"
            )
        # (kv_length, kv_offset): one key at the query's own offset → an all-visible 1×1 mask.
        return 1, self.get_seq_length(layer_idx)

    def layer_lengths(self) -> list[int]:
        """Cached entries per layer."""
        return [layer.get_seq_length() for layer in self.layers]


@dataclass
class AppendedKV:
    """Entries a method adds to a compressed cache after its eviction (RestoreKV's restore tokens).

    Attributes:
        keys, values: per layer ``(1, kv_heads, n, head_dim)``, RoPE applied at positions ``first..first+n-1``.
        first: the position of the first entry (the prompt length ``S``: they follow the prompt).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    first: int

    @property
    def length(self) -> int:
        """``n``, entries per KV head in each layer."""
        return self.keys[0].shape[2]

    def positions(self, layer_idx: int) -> torch.Tensor:
        """``(1, kv_heads, n)`` positions of layer ``layer_idx``'s entries, in a kept index's layout."""
        keys = self.keys[layer_idx]
        span = torch.arange(self.first, self.first + self.length, device=keys.device)
        return span.expand(1, keys.shape[1], -1)


def append_entries(cache: DynamicCache, appended: AppendedKV) -> None:
    """Add ``appended``'s entries after every layer's entries of ``cache``, in place; they are never masked
    (a layer's key mask covers only the entries before them: :func:`key_mask`)."""
    if len(appended.keys) != len(cache.layers):
        raise ValueError(
            f"got appended entries for {len(appended.keys)} layers, the cache has {len(cache.layers)}"
        )
    for layer, keys, values in zip(cache.layers, appended.keys, appended.values, strict=True):
        layer.keys = torch.cat([layer.keys, keys.to(layer.keys)], dim=2)
        layer.values = torch.cat([layer.values, values.to(layer.values)], dim=2)


def gather_cache(
    cache: DynamicCache, indices: Sequence[torch.Tensor], in_place: bool = True
) -> CompressedCache:
    """Keep only ``indices`` of every layer.

    Args:
        cache: a single-sequence cache, layer ``l`` holding ``(1, kv_heads, S, head_dim)``.
        indices: per layer ``(1, kv_heads, C_l)`` int64 positions to keep, ascending.
        in_place: the returned cache shares (and shrinks) ``cache``'s layers; False leaves ``cache`` whole and
            gathers into new layers (only the kept entries are copied: no full copy of ``cache`` is made).
    """
    if len(indices) != len(cache.layers):
        raise ValueError(f"got kept positions for {len(indices)} layers, the cache has {len(cache.layers)}")
    target = cache if in_place else CompressedCache([copy.copy(layer) for layer in cache.layers])
    for layer_idx, index in enumerate(indices):
        gather_layer(target, layer_idx, index)
    return CompressedCache(target.layers)


def gather_layer(cache: DynamicCache, layer_idx: int, index: torch.Tensor) -> None:
    """Keep only ``index (1, kv_heads, C)`` of layer ``layer_idx`` of ``cache``, in place.

    Each head's row holds its kept positions in ascending order; ``-1`` marks a padding slot (a head keeping
    fewer entries than the layer's widest head): it gets zero keys and values and is masked in the layer's
    key mask (:func:`key_mask`). A layer that already has a key mask keeps its masked entries masked.
    """
    layer = cache.layers[layer_idx]
    if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
        raise NotImplementedError(
            f"layer {layer_idx} is a {type(layer).__name__}; only full-attention cache layers can be compressed"
        )
    if layer.keys.shape[0] != 1 or index.shape[:2] != layer.keys.shape[:2]:
        raise ValueError(
            f"layer {layer_idx}: positions of shape {tuple(index.shape)} do not fit keys of shape "
            f"{tuple(layer.keys.shape)} (one sequence, one row of positions per KV head)"
        )
    valid = index >= 0
    previous = key_mask(layer, layer.keys.shape[2])
    index = index.clamp_min(0)
    if previous is not None:
        valid = valid & previous.gather(2, index.to(previous.device))
    layer.keys = _gather(layer.keys, index, valid)
    layer.values = _gather(layer.values, index, valid)
    setattr(layer, KEY_MASK_ATTR, None if bool(valid.all()) else valid.to(layer.keys.device))


def key_mask(layer: CacheLayerMixin, length: int) -> torch.Tensor | None:
    """The layer's key mask over its first ``length`` entries, ``(batch, kv_heads, length)`` bool (True = may be
    attended), or ``None`` when every entry may be: entries past the mask (appended after compression) are
    real, entries cut off (a cropped cache) are gone."""
    mask = getattr(layer, KEY_MASK_ATTR, None)
    if mask is None:
        return None
    if mask.shape[2] >= length:
        return mask[..., :length]
    return torch.cat([mask, mask.new_ones(*mask.shape[:2], length - mask.shape[2])], dim=2)


def has_key_masks(cache: DynamicCache) -> bool:
    """Whether any layer of ``cache`` masks some of its entries (heads of a layer keeping different counts)."""
    return any(getattr(layer, KEY_MASK_ATTR, None) is not None for layer in cache.layers)


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only batch rows ``rows`` of every layer of ``cache`` (key masks included), in place."""
    cache.batch_select_indices(rows)
    for layer in cache.layers:
        mask = getattr(layer, KEY_MASK_ATTR, None)
        if mask is not None:
            setattr(layer, KEY_MASK_ATTR, mask[rows.to(mask.device)])


def _gather(states: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``states (1, kv_heads, S, d)``, ``index (1, kv_heads, C)`` → a new ``(1, kv_heads, C, d)`` tensor, zeros
    where ``valid (1, kv_heads, C)`` is False."""
    out = states.gather(2, index.to(states.device)[..., None].expand(-1, -1, -1, states.shape[-1]))
    return out if bool(valid.all()) else out.masked_fill(~valid.to(out.device)[..., None], 0)


def token_bytes(config: PretrainedConfig, dtype_bytes: int) -> int:
    """Bytes of one token's keys and values in every layer: ``2 · layers · kv_heads · head_dim · dtype_bytes``."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes held by the cache's key and value tensors (``numel · element_size``, all layers)."""
    return sum(layer_bytes(layer) for layer in cache.layers)


def layer_bytes(layer: CacheLayerMixin) -> int:
    """Bytes held by one cache layer's key and value tensors."""
    states = (getattr(layer, "keys", None), getattr(layer, "values", None))
    return sum(t.numel() * t.element_size() for t in states if t is not None)
