"""Importance capture through the transformers attention interface.

Every eviction signal in lkv — ground-truth labels, the lookahead tokens' predictions, SnapKV/TOVA/H2O
windows — is the same quantity: for a block of query tokens, the attention mass that each KV head puts on
the first ``S`` keys, averaged over the block's queries and over the query heads of the GQA group, then
renormalised over those ``S`` keys.

``install_capture(model)`` switches a model to a wrapped copy of its own attention implementation (sdpa,
eager, flash, ...). The wrapper is a no-op unless a forward pass is given ``lkv_capture=ImportanceCapture``
(or a list of them, e.g. several methods' windows from one prefill) as a keyword argument, which transformers threads down to the attention function of every layer. The
capture then computes the block's attention rows itself in fp32, in query chunks, and immediately reduces
them to ``(batch, kv_heads, S)``: memory is O(L·H_kv·S) for the result plus one chunk of rows for one
layer at a time — never an S×S matrix, never all layers' attention at once. A capture may also read each
attention module's input hidden states (:meth:`AttentionCapture.observe_input`; Expected Attention's query
statistics, and :class:`HiddenCapture`, which a per-token probe scores each prompt token from).

The same installation makes attention honour a compressed cache's key masks (heads of a layer keeping
different counts, :mod:`lkv.core.cache`): a pre-hook on the decoder hands any cache carrying them to the
wrapper, which blocks the masked slots in that layer's attention mask, whoever runs the forward pass
(lkv's decoding, kvpress's pipeline, ``model.generate``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from lkv.core.cache import has_key_masks, key_mask

CAPTURE_KWARG = "lkv_capture"
# forward keyword carrying a cache with key masks down to the attention wrapper (set by the decoder pre-hook)
KEY_MASK_KWARG = "lkv_key_masks"
# the keywords a decoder's forward gets its cache by (transformers ≥ 5.24: ``cache``; before: ``past_key_values``)
_CACHE_KEYWORDS = ("cache", "past_key_values")
_PREFIX = "lkv_"
# Upper bound on one chunk of fp32 attention rows (batch · heads · queries · keys): 2^26 floats = 256 MiB.
_CHUNK_ELEMENTS = 1 << 26


class AttentionCapture:
    """What the capturing attention wrapper feeds during a forward pass given ``lkv_capture=...``.

    Args:
        num_keys: ``S``, the number of leading keys (the prompt) the capture is about.
        last_queries: only the last ``n`` queries of each observed block count; ``None``: every query.

    Two captures of the same class, ``num_keys`` and ``last_queries`` collect the same thing, so one prefill
    may fill one capture for both (``lkv eval``'s shared prefill).
    """

    # also compute the block's attention output (the layer's own kernel is then skipped)
    computes_output: bool = False

    def __init__(self, num_keys: int, last_queries: int | None = None) -> None:
        if num_keys <= 0:
            raise ValueError(f"num_keys must be positive, got {num_keys}")
        if last_queries is not None and last_queries <= 0:
            raise ValueError(f"last_queries must be positive or None, got {last_queries}")
        self.num_keys = num_keys
        self.last_queries = last_queries

    def observe_input(self, module: nn.Module, hidden_states: torch.Tensor) -> None:
        """Called with each attention module's input ``hidden_states (batch, Q, hidden)`` before it runs."""

    def observe(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        value: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Called inside each layer's attention (see :meth:`ImportanceCapture.observe` for the arguments)."""
        return None


class ImportanceCapture(AttentionCapture):
    """Collects the reduced attention of one query block on the first ``num_keys`` keys, layer by layer.

    Args:
        num_keys: ``S``, the number of leading keys (the prompt) whose attention mass is kept.
        last_queries: use only the last ``n`` queries of each observed block (SnapKV/TOVA windows inside
            a prefill); ``None`` uses every query of the block.
        computes_output: also compute the block's attention output from the same fp32 probabilities, so
            the layer skips its own attention kernel, which would compute the same logits again (the
            lookahead step, where every query of the block is captured). Needs ``last_queries=None``.

    Several forward passes may feed the same capture (e.g. a response teacher-forced in pieces): the
    per-layer sums accumulate and are normalised once in :meth:`scores`.
    """

    def __init__(self, num_keys: int, last_queries: int | None = None, computes_output: bool = False) -> None:
        super().__init__(num_keys, last_queries)
        if computes_output and last_queries is not None:
            raise ValueError("computes_output needs every query of the block: last_queries must be None")
        self.computes_output = computes_output
        self._sums: dict[int, torch.Tensor] = {}

    def observe(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        value: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Add one layer's block attention to the running sums.

        Args:
            query: ``(batch, heads, Q, head_dim)`` after RoPE.
            key: ``(batch, kv_heads, K, head_dim)``, the whole cache including the block (K ≥ Q).
            attention_mask: the mask the layer's attention got: ``None`` (plain causal), a boolean
                ``(batch|1, 1|heads, Q, K)`` mask (True = may attend) or an additive float one.
            scaling: the softmax temperature the layer uses (usually ``head_dim ** -0.5``).
            value: ``(batch, kv_heads, K, head_dim)``; given only when ``computes_output``.

        Returns:
            With ``value``, the block's attention output ``(batch, Q, heads, head_dim)`` in the query's
            dtype (the layout transformers' attention functions return); otherwise ``None``.
        """
        first = self.first_query(layer_idx, query, key)
        batch, heads, q_len = query.shape[:3]
        key32 = key.float()
        value32 = None if value is None else value.float()
        total = None
        outputs = []
        for start, stop in query_blocks(first, q_len, batch * heads * key.shape[2]):
            probs = grouped_attention(query, key32, attention_mask, scaling, start, stop)
            part = probs[..., : self.num_keys].sum(dim=(2, 3))
            total = part if total is None else total + part
            if value32 is not None:
                with torch.autocast(query.device.type, enabled=False):
                    outputs.append(torch.einsum("bkgqn,bknd->bkgqd", probs, value32).flatten(1, 2))
        previous = self._sums.get(layer_idx)
        self._sums[layer_idx] = total if previous is None else previous + total
        if value32 is None:
            return None
        return torch.cat(outputs, dim=2).transpose(1, 2).to(query.dtype).contiguous()

    def first_query(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> int:
        """Index of the first block query this capture reduces, once the shapes are checked.

        Args:
            query: ``(batch, heads, Q, head_dim)``; key: ``(batch, kv_heads, K, head_dim)``.
        """
        heads, q_len = query.shape[1], query.shape[2]
        kv_heads, k_len = key.shape[1], key.shape[2]
        if heads % kv_heads:
            raise ValueError(
                f"layer {layer_idx}: {heads} query heads are not a multiple of {kv_heads} KV heads"
            )
        if k_len < self.num_keys:
            raise ValueError(
                f"layer {layer_idx}: cache holds {k_len} keys, fewer than num_keys={self.num_keys}"
            )
        return 0 if self.last_queries is None else max(q_len - self.last_queries, 0)

    @property
    def layers(self) -> list[int]:
        """Indices of the layers observed so far."""
        return sorted(self._sums)

    def scores(self, num_layers: int | None = None) -> torch.Tensor:
        """Normalised importance ``(batch, layers, kv_heads, S)``; every ``[b, l, h]`` row sums to 1.

        Args:
            num_layers: expected layer count; raises if some layer was never observed (e.g. a model whose
                attention does not go through the transformers attention interface).
        """
        if not self._sums:
            raise RuntimeError(
                "no attention was captured: was the model prepared with lkv.core.attention.install_capture() "
                f"and the forward pass given {CAPTURE_KWARG}=...?"
            )
        if num_layers is not None and self.layers != list(range(num_layers)):
            raise RuntimeError(f"captured layers {self.layers}, expected 0..{num_layers - 1}")
        return _normalise(torch.stack([self._sums[i] for i in self.layers], dim=1))

    def take(self, layer_idx: int) -> torch.Tensor:
        """One layer's normalised importance ``(batch, kv_heads, S)``, its running sum then dropped.

        Layer-streamed eviction (:mod:`lkv.eviction.streamed`) scores each layer as soon as it is observed,
        so the sums of all layers never need to be held at once.
        """
        if layer_idx not in self._sums:
            raise RuntimeError(
                f"no attention was captured for layer {layer_idx} (observed so far: {self.layers}); was the "
                f"forward pass given {CAPTURE_KWARG}=...?"
            )
        return _normalise(self._sums.pop(layer_idx))


def query_blocks(first: int, q_len: int, row_elements: int) -> list[tuple[int, int]]:
    """``(start, stop)`` blocks of queries ``first..q_len`` whose fp32 attention rows (``row_elements`` floats per
    query: batch · heads · keys) stay within one chunk of at most 2^26 floats (256 MiB)."""
    chunk = max(1, _CHUNK_ELEMENTS // max(1, row_elements))
    return [(start, min(start + chunk, q_len)) for start in range(first, q_len, chunk)]


def _normalise(sums: torch.Tensor) -> torch.Tensor:
    """``sums (..., S)`` divided by their total over the last dimension (rows of zeros stay zero)."""
    return sums / sums.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(sums.dtype).tiny)


class HiddenCapture(AttentionCapture):
    """Collects each layer's attention input during a forward pass given it as (or in) ``lkv_capture=``.

    The attention input is what the attention module projects to queries, keys and values: the residual stream
    after the layer's input norm, ``(batch, Q, hidden)`` (NVIDIA kvpress's ``hidden_states``, which KVzap's
    probes read). Layer ``l``'s input is observed before its attention runs, so a layer-streamed prefill can
    read it as soon as the prompt has passed layer ``l``.

    Args:
        reduce: ``(layer_idx, hidden (batch, Q, hidden)) → tensor``, applied as each layer is observed so that
            only its result is kept (e.g. a probe's per-token scores instead of every layer's hidden states);
            ``None`` keeps the hidden states themselves.
    """

    def __init__(self, reduce: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> None:
        # it reads no attention rows, so no key count: it is never merged with another capture of a prefill
        self.num_keys = self.last_queries = None
        self.reduce = reduce
        self._kept: dict[int, torch.Tensor] = {}

    def observe_input(self, module: nn.Module, hidden_states: torch.Tensor) -> None:
        """Keep one layer's attention input ``(batch, Q, hidden)`` (or what ``reduce`` makes of it)."""
        layer_idx = module.layer_idx
        self._kept[layer_idx] = (
            hidden_states if self.reduce is None else self.reduce(layer_idx, hidden_states)
        )

    @property
    def layers(self) -> list[int]:
        """Indices of the layers observed so far."""
        return sorted(self._kept)

    def stacked(self, num_layers: int) -> torch.Tensor:
        """What was kept of every layer, stacked on dim 1: ``(batch, layers, ...)``.

        Raises:
            RuntimeError: when some layer of ``0..num_layers-1`` was not observed.
        """
        if self.layers != list(range(num_layers)):
            raise RuntimeError(
                f"attention inputs of layers {self.layers} were captured, expected 0..{num_layers - 1}: was "
                f"the model prepared with lkv.core.attention.install_capture() and given {CAPTURE_KWARG}=...?"
            )
        return torch.stack([self._kept[i] for i in self.layers], dim=1)

    def take(self, layer_idx: int) -> torch.Tensor:
        """What was kept of one layer, then dropped (layer-streamed eviction reads each layer once)."""
        if layer_idx not in self._kept:
            raise RuntimeError(
                f"no attention input was captured for layer {layer_idx} (observed so far: {self.layers}); "
                f"was the forward pass given {CAPTURE_KWARG}=...?"
            )
        return self._kept.pop(layer_idx)


def grouped_attention(
    query: torch.Tensor,
    key32: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    start: int,
    stop: int,
) -> torch.Tensor:
    """fp32 softmax attention of block queries ``start:stop`` on every key, per GQA group.

    Args:
        query: ``(batch, heads, Q, head_dim)`` after RoPE; the block is the tail of the cache.
        key32: ``(batch, kv_heads, K, head_dim)`` float32 keys, the whole cache.
        attention_mask: as in :meth:`ImportanceCapture.observe`.

    Returns:
        ``(batch, kv_heads, group, stop - start, K)``: the query heads of one GQA group share a KV head.
    """
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key32.shape[1], key32.shape[2]
    grouped = query[:, :, start:stop].reshape(batch, kv_heads, heads // kv_heads, stop - start, head_dim)
    # fp32 rows even under bf16 autocast: the scores of ~S keys are ~1/S each and feed a KL loss.
    with torch.autocast(query.device.type, enabled=False):
        logits = torch.einsum("bkgqd,bknd->bkgqn", grouped.float(), key32) * scaling
        logits = _apply_mask(logits, attention_mask, start, stop, q_len, k_len)
        return torch.softmax(logits, dim=-1)


def _apply_mask(
    logits: torch.Tensor, mask: torch.Tensor | None, start: int, stop: int, q_len: int, k_len: int
) -> torch.Tensor:
    """Mask ``logits (batch, kv_heads, group, stop-start, K)`` for block queries ``start:stop``."""
    if mask is None:
        # Plain causal: block query i sits at key index K - Q + i (the block is the tail of the cache).
        rows = torch.arange(start, stop, device=logits.device) + (k_len - q_len)
        allowed = torch.arange(k_len, device=logits.device)[None, :] <= rows[:, None]
        return logits.masked_fill(~allowed, float("-inf"))
    rows = mask[..., start:stop, :k_len]
    # (batch|1, heads|1, q, K) → broadcast over (batch, kv_heads, group, q, K)
    if rows.shape[1] == 1:
        rows = rows[:, :, None]
    else:
        rows = rows.reshape(rows.shape[0], logits.shape[1], logits.shape[2], stop - start, k_len)
    if rows.dtype == torch.bool:
        return logits.masked_fill(~rows, float("-inf"))
    return logits + rows.float()


def _base_attention(implementation: str, module: nn.Module) -> Callable:
    """The attention function the model would use without lkv (eager lives in each modeling file)."""
    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _make_capturing(implementation: str) -> Callable:
    def capturing_attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs,
    ):
        captures = kwargs.pop(CAPTURE_KWARG, None)
        masked = kwargs.pop(KEY_MASK_KWARG, None)
        if masked is not None:
            allowed = key_mask(masked.layers[module.layer_idx], key.shape[2])
            if allowed is not None:
                attention_mask = merge_mask(attention_mask, query_rows(allowed, query), query.dtype)
        output = None
        if captures is not None:
            scaling = kwargs.get("scaling")
            scaling = module.scaling if scaling is None else scaling
            for capture in captures if isinstance(captures, (list, tuple)) else (captures,):
                if capture.computes_output and output is None and _plain_softmax(kwargs):
                    output = capture.observe(module.layer_idx, query, key, attention_mask, scaling, value)
                else:
                    capture.observe(module.layer_idx, query, key, attention_mask, scaling)
        if output is not None:
            return output, None
        return _base_attention(implementation, module)(module, query, key, value, attention_mask, **kwargs)

    return capturing_attention


def query_rows(allowed: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """A key mask ``(batch, kv_heads, K)`` as attention-mask rows ``(batch, heads, Q, K)`` for ``query (batch, heads,
    Q, d)``: each query head takes its KV head's row, and a block of ``Q > 1`` queries (the tail of the ``K``
    keys) is also made causal, since a mask given to the attention replaces its own causal masking."""
    heads, q_len = query.shape[1], query.shape[2]
    rows = allowed.repeat_interleave(heads // allowed.shape[1], dim=1)[:, :, None, :]
    if q_len == 1:
        return rows
    k_len = allowed.shape[2]
    block = torch.arange(k_len - q_len, k_len, device=allowed.device)
    causal = torch.arange(k_len, device=allowed.device)[None, :] <= block[:, None]
    return rows & causal


def merge_mask(mask: torch.Tensor | None, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A layer's attention mask further restricted to ``allowed`` keys.

    Args:
        mask: the layer's mask: ``None``, boolean (True = may attend) or additive float, broadcastable to
            ``allowed``.
        allowed: ``(batch, heads, q, K)`` bool.
        dtype: the attention's dtype (for an additive mask).

    Returns:
        a boolean mask if ``mask`` was boolean, else an additive one of ``dtype`` (``None`` becomes additive, which
        sdpa and eager both take).
    """
    if mask is not None and mask.dtype == torch.bool:
        return mask[..., : allowed.shape[-1]] & allowed
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    if mask is None:
        return blocked
    # min + min overflows to -inf, which softmax treats as a masked key too.
    return mask[..., : allowed.shape[-1]].to(dtype) + blocked


def _observe_inputs(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Attention pre-hook: hand the module's input hidden states to the forward pass's captures."""
    captures = kwargs.get(CAPTURE_KWARG)
    if captures is None:
        return
    hidden_states = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    for capture in captures if isinstance(captures, (list, tuple)) else (captures,):
        capture.observe_input(module, hidden_states)


def _route_key_masks(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Decoder pre-hook: a forward pass over a cache with key masks carries that cache to the attention wrapper."""
    cache = next((kwargs[name] for name in _CACHE_KEYWORDS if kwargs.get(name) is not None), None)
    if cache is None or not hasattr(cache, "layers") or not has_key_masks(cache):
        return None
    return args, {**kwargs, KEY_MASK_KWARG: cache}


def _install_hooks(model: PreTrainedModel) -> None:
    """The decoder's key-mask pre-hook and every attention module's input pre-hook, once per model."""
    decoder = model.get_decoder()
    if getattr(decoder, "_lkv_hooked", False):
        return
    decoder.register_forward_pre_hook(_route_key_masks, with_kwargs=True)
    for layer in getattr(decoder, "layers", ()):
        attention = getattr(layer, "self_attn", None)
        if attention is not None:
            attention.register_forward_pre_hook(_observe_inputs, with_kwargs=True)
    decoder._lkv_hooked = True


def _plain_softmax(kwargs: dict) -> bool:
    """Whether the layer's attention is plain masked softmax attention, which a capture can stand in for."""
    return not kwargs.get("dropout") and all(
        kwargs.get(name) is None for name in ("sliding_window", "softcap", "s_aux")
    )


# implementation → why the capture cannot run under it
REFUSED_ATTENTION = {
    "flex_attention": "it passes a BlockMask, which the capture would have to slice like a tensor mask",
}
SUPPORTED_ATTENTION = ("sdpa", "eager")


def check_attn_implementation(name: str) -> None:
    """Refuse an attention implementation the capture cannot work with (before any weights are loaded).

    Supported and tested: ``sdpa`` (the default) and ``eager``. ``flash_attention_2`` is passed through (at
    batch size 1 its mask is None, which the capture reads as plain causal) but untested here.
    """
    if name in REFUSED_ATTENTION:
        raise ValueError(
            f"attn_implementation={name!r} is not supported: {REFUSED_ATTENTION[name]}; "
            f"use one of {', '.join(SUPPORTED_ATTENTION)}"
        )


def install_capture(model: PreTrainedModel) -> str:
    """Route ``model``'s attention through the capturing wrapper of its current implementation, and hand each
    attention module's input to the captures that read it (:meth:`AttentionCapture.observe_input`).

    Idempotent. Returns the new implementation name (``lkv_<base>``). Outputs are unchanged: the wrapper
    calls the original implementation and only adds work when ``lkv_capture`` is passed or the cache carries
    key masks (then the masked entries are left out, as if they had been evicted).

    Raises:
        ValueError: for an implementation in :data:`REFUSED_ATTENTION` (see :func:`check_attn_implementation`).
    """
    current = model.config._attn_implementation
    if current.startswith(_PREFIX):
        _install_hooks(model)
        return current
    check_attn_implementation(current)
    if getattr(model.config, "attn_logit_softcapping", None):
        raise NotImplementedError(f"{model.config.model_type}: attention logit soft-capping is not supported")
    name = wrap_attention(model, _PREFIX, _make_capturing)
    _install_hooks(model)
    return name


def wrap_attention(model: PreTrainedModel, prefix: str, make: Callable[[str], Callable]) -> str:
    """Switch ``model`` to the attention implementation ``<prefix><current>``: ``make(current)``, a wrapper of
    its current implementation, registered (once per process) with the current one's mask function. Returns
    the new name."""
    current = model.config._attn_implementation
    name = prefix + current
    if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(name, make(current))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    model.set_attn_implementation(name)
    return name
