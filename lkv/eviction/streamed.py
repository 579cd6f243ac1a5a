"""Layer-streamed eviction: each layer is scored and cut to its budget as soon as the prompt has passed it.

The two-phase path (:meth:`lkv.eviction.compressor.Compressor.compress`) prefills the whole prompt, scores it,
then evicts, so the full K/V of every layer exists at once (Llama-3.1-8B in bf16: 128 KiB per token, 16 GiB
at 128K tokens). A press whose layer-``l`` scores depend on layers ``≤ l`` only (:attr:`Press.streamable`:
SnapKV, PyramidKV, TOVA, H2O, StreamingLLM, Random, LookaheadKV) is instead scored inside the prefill: a
forward hook on every decoder layer runs, right after the prompt has passed layer ``l``,

    scores_l = press.layer_scorer(...)(l)              (1, kv_heads, S); LookaheadKV runs its M tokens
                                                        through layer l here (:class:`LookaheadStream`)
    kept_l   = select_indices(scores_l, [C_l], ...)     the shared selector, the layer's own budget
    gather layer l's K/V to kept_l                      before layer l + 1 runs

Every step is the two-phase path's own, restricted to one layer, so scores, kept positions and K/V are the
same; decoding afterwards is unchanged (positions continue from ``S``). K/V memory peaks at one layer's
full K/V + the compressed earlier layers (+ the lookahead tokens' ``M``-token stream), instead of all layers'
full K/V (docs/performance.md, "Layer-streamed eviction").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel

from lkv.core.attention import CAPTURE_KWARG
from lkv.core.cache import CompressedCache, gather_layer, layer_bytes, token_bytes
from lkv.core.generation import prefill
from lkv.eviction.presses.base import LayerScorer, Press, StreamContext
from lkv.eviction.selector import DEFAULT_SELECTION, Selection, select_indices


@dataclass
class StreamedEviction:
    """A prompt prefilled with layer-streamed eviction.

    Attributes:
        cache: the compressed cache; layer ``l`` holds ``(1, kv_heads, C_l, head_dim)``.
        next_logits: ``(1, vocab)`` logits after the last prompt token.
        kept: per layer ``(1, kv_heads, C_l)`` kept positions (ascending).
        scores: the ``(1, layers, kv_heads, S)`` scores if asked for (``keep_scores``), else ``None``.
        kv_bytes_full: bytes the full K/V of all layers would have held.
        prefill_s: seconds of the prefill outside the layer hooks.
        eviction_s: seconds inside them (scoring, LookaheadKV's lookahead step, selection, gathering).
    """

    cache: CompressedCache
    next_logits: torch.Tensor
    kept: list[torch.Tensor]
    scores: torch.Tensor | None
    kv_bytes_full: int
    prefill_s: float
    eviction_s: float


class LayerEvictor:
    """Layer-streamed eviction's per-layer step: score, select and gather the layer the prompt has just passed.

    Built once per prompt, before its prefill, which must be run with :attr:`forward_kwargs`; then
    :meth:`evict` (or :meth:`select` for a caller that gathers the K/V itself, as kvpress's hook does) is
    called for layers ``0, 1, ...`` in turn, each right after the prompt has passed that layer. Two hooks
    drive it: :func:`streamed_compress` (a forward hook on every decoder layer) and
    ``lkv.integrations.kvpress`` (kvpress's hook on every attention module).

    Args:
        model: the frozen model (prepared with ``install_capture``; for LookaheadKV the adapter's base model).
        press: a :attr:`~lkv.eviction.presses.base.Press.streamable` press.
        ids: ``(1, S)`` prompt tokens.
        cache: the empty cache the prompt is prefilled into.
        budgets: ``C_l`` per layer (``press.layer_budgets``); ``C_l ≥ S`` keeps the layer whole.
        selection: the selector's settings (:class:`~lkv.eviction.selector.Selection`), merged with the
            press's own protected window by the caller.
        keep_scores: also keep every layer's ``(1, kv_heads, S)`` scores (:attr:`scores`).
        clock: timer for :attr:`seconds`.
        width: under an ``adaptive`` head budget, gather each layer to this many slots instead of to its
            widest head's count (:func:`select_indices`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        press: Press,
        ids: torch.Tensor,
        cache: DynamicCache,
        budgets: Sequence[int],
        selection: Selection = DEFAULT_SELECTION,
        keep_scores: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        width: int | None = None,
    ) -> None:
        if not press.streamable:
            raise ValueError(f"{press.name} has no layer-streamed eviction; use the two-phase path")
        self.num_layers = len(model.get_decoder().layers)
        if len(budgets) != self.num_layers:
            raise ValueError(f"got {len(budgets)} layer budgets for {self.num_layers} decoder layers")
        self.capture = press.prefill_capture(ids.shape[1])
        self.press, self.ids = press, ids
        self.cache, self.budgets, self.clock, self.keep_scores = cache, list(budgets), clock, keep_scores
        self.selection, self.width = selection, width
        self.scorer: LayerScorer = press.layer_scorer(StreamContext(model, ids, cache, self.capture))
        self.kept: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.kv_bytes_full = 0
        self.seconds = 0.0
        # True while a layer is scored: the lookahead stream runs that layer again from inside the hook
        self.busy = False

    @property
    def forward_kwargs(self) -> dict[str, object]:
        """Keywords the prompt's prefill must be given (the press's attention capture, if it has one)."""
        return {} if self.capture is None else {CAPTURE_KWARG: self.capture}

    def select(self, layer_idx: int) -> torch.Tensor:
        """Score layer ``layer_idx`` (which holds the prompt's ``S`` entries) and return its kept positions
        ``(1, kv_heads, C_l)``, ascending (``-1``: a padding slot of an ``adaptive`` head budget); the cache is
        left as it is."""
        if layer_idx != len(self.kept):
            raise RuntimeError(
                f"decoder layer {layer_idx} ran out of order (expected layer {len(self.kept)})"
            )
        start = self.clock()
        self.busy = True
        try:
            self.kv_bytes_full += layer_bytes(self.cache.layers[layer_idx])
            scores = self.scorer(layer_idx)
            budget = self.budgets[layer_idx]
            ranked = self.press.budget_scores(scores, self.ids, budget)
            index = select_indices(ranked[:, None], [budget], self.selection, self.width)[0]
        finally:
            self.busy = False
        self.kept.append(index)
        if self.keep_scores:
            self.scores.append(scores)
        self.seconds += self.clock() - start
        return index

    def evict(self, layer_idx: int) -> None:
        """:meth:`select` layer ``layer_idx``, then cut its cache entries to the kept positions in place."""
        index = self.select(layer_idx)
        start = self.clock()
        gather_layer(self.cache, layer_idx, index)
        self.seconds += self.clock() - start

    def hook(self, layer_idx: int, module: nn.Module, args: tuple, output: object) -> None:
        """Forward hook of decoder layer ``layer_idx`` (bind the index with ``functools.partial``)."""
        if not self.busy:
            self.evict(layer_idx)

    def check_done(self) -> None:
        """Raise unless every decoder layer was evicted during the prefill."""
        if len(self.kept) != self.num_layers:
            raise RuntimeError(
                f"{len(self.kept)} of {self.num_layers} decoder layers were evicted during the prefill"
            )


@torch.no_grad()
def streamed_compress(
    model: PreTrainedModel,
    press: Press,
    ids: torch.Tensor,
    budgets: Sequence[int],
    selection: Selection = DEFAULT_SELECTION,
    keep_scores: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamedEviction:
    """Prefill ``ids (1, S)`` layer by layer, cutting each layer to its budget before the next one runs.

    Args: as :class:`LayerEvictor` (``clock``: the Compressor's waits for queued GPU work).
    """
    cache = DynamicCache(config=model.config)
    evictor = LayerEvictor(model, press, ids, cache, budgets, selection, keep_scores, clock)
    layers = model.get_decoder().layers
    handles = [layer.register_forward_hook(partial(evictor.hook, i)) for i, layer in enumerate(layers)]
    start = clock()
    try:
        cache, next_logits = prefill(model, ids, cache=cache, **evictor.forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    total = clock() - start
    evictor.check_done()
    return StreamedEviction(
        cache=CompressedCache(cache.layers),
        next_logits=next_logits,
        kept=evictor.kept,
        scores=torch.stack(evictor.scores, dim=1) if keep_scores else None,
        kv_bytes_full=evictor.kv_bytes_full,
        prefill_s=total - evictor.seconds,
        eviction_s=evictor.seconds,
    )


def peak_kv_bytes(
    config: PretrainedConfig, prompt_len: int, budget: int, num_lookahead: int = 0, dtype_bytes: int = 2
) -> dict[str, int]:
    """The K/V-side memory of a prefill + eviction, two-phase vs layer-streamed (docs/performance.md).

    Args:
        config: the model's config (layers, KV heads, head dimension, hidden size).
        prompt_len: ``S``; budget: ``C`` tokens per KV head in every layer; num_lookahead: ``M`` (0: no lookahead).
        dtype_bytes: bytes per element of the K/V and hidden states (bf16: 2).

    Returns:
        ``layer_full`` (one layer's full K/V + the lookahead tokens' K/V in it), ``compressed`` (every layer at
        ``C``), ``lookahead_stream`` (the ``M`` tokens' hidden state + the layer's fp32 score sums), and the two
        totals: ``streamed`` (their sum) and ``two_phase`` (all layers' full K/V at once, the lookahead
        tokens' K/V in every layer, all layers' fp32 score sums).
    """
    layers = config.num_hidden_layers
    per_token_layer = token_bytes(config, dtype_bytes) // layers  # keys + values
    layer_full = (prompt_len + num_lookahead) * per_token_layer
    compressed = layers * min(budget, prompt_len) * per_token_layer
    stream = num_lookahead * config.hidden_size * dtype_bytes + 4 * config.num_key_value_heads * prompt_len
    return {
        "layer_full": layer_full,
        "compressed": compressed,
        "lookahead_stream": stream,
        "streamed": layer_full + compressed + stream,
        "two_phase": layers * (layer_full + 4 * config.num_key_value_heads * prompt_len),
    }
