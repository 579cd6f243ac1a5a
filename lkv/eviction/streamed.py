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

from lkv.core.cache import CompressedCache, gather_layer, layer_bytes
from lkv.core.generation import prefill
from lkv.eviction.presses.base import LayerScorer, Press, StreamContext
from lkv.eviction.presses.selector import select_indices


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


class _LayerEvictor:
    """Forward hook of every decoder layer: score, select and gather the layer the prompt has just passed."""

    def __init__(
        self,
        cache: DynamicCache,
        scorer: LayerScorer,
        select: Callable[[torch.Tensor, int], torch.Tensor],
        keep_scores: bool,
        clock: Callable[[], float],
    ) -> None:
        self.cache, self.scorer, self.select, self.clock = cache, scorer, select, clock
        self.keep_scores = keep_scores
        self.kept: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.kv_bytes_full = 0
        self.seconds = 0.0
        self.busy = False  # the lookahead stream runs the same layer again from inside this hook

    def __call__(self, layer_idx: int, module: nn.Module, args: tuple, output: object) -> None:
        if self.busy:
            return
        if layer_idx != len(self.kept):
            raise RuntimeError(
                f"decoder layer {layer_idx} ran out of order (expected layer {len(self.kept)})"
            )
        start = self.clock()
        self.busy = True
        try:
            self.kv_bytes_full += layer_bytes(self.cache.layers[layer_idx])
            scores = self.scorer(layer_idx)
            index = self.select(scores, layer_idx)
            gather_layer(self.cache, layer_idx, index)
        finally:
            self.busy = False
        self.kept.append(index)
        if self.keep_scores:
            self.scores.append(scores)
        self.seconds += self.clock() - start


@torch.no_grad()
def streamed_compress(
    model: PreTrainedModel,
    press: Press,
    ids: torch.Tensor,
    budgets: Sequence[int],
    sink: int = 0,
    recent: int = 0,
    kernel: int = 1,
    pooling: str = "max",
    keep_scores: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamedEviction:
    """Prefill ``ids (1, S)`` layer by layer, cutting each layer to its budget before the next one runs.

    Args:
        model: the frozen model (prepared with ``install_capture``; for LookaheadKV the adapter's base model).
        press: a :attr:`~lkv.eviction.presses.base.Press.streamable` press.
        budgets: ``C_l`` per layer (``press.layer_budgets``); ``C_l ≥ S`` keeps the layer whole.
        sink, recent, kernel, pooling: the selector's options (:func:`select_indices`), merged with the
            press's own protected window by the caller.
        keep_scores: also return every layer's scores (a decode-time policy may seed from them).
        clock: timer (the Compressor's waits for queued GPU work).
    """
    if not press.streamable:
        raise ValueError(f"{press.name} has no layer-streamed eviction; use the two-phase path")
    layers = model.get_decoder().layers
    if len(budgets) != len(layers):
        raise ValueError(f"got {len(budgets)} layer budgets for {len(layers)} decoder layers")
    prompt_len = ids.shape[1]
    capture = press.prefill_capture(prompt_len)
    cache = DynamicCache(config=model.config)
    scorer = press.layer_scorer(StreamContext(model, ids, cache, capture))

    def select(scores: torch.Tensor, layer_idx: int) -> torch.Tensor:
        return select_indices(scores[:, None], [budgets[layer_idx]], sink, recent, kernel, pooling)[0]

    evictor = _LayerEvictor(cache, scorer, select, keep_scores, clock)
    handles = [layer.register_forward_hook(partial(evictor, i)) for i, layer in enumerate(layers)]
    start = clock()
    try:
        cache, next_logits = prefill(
            model, ids, cache=cache, **({} if capture is None else {"lkv_capture": capture})
        )
    finally:
        for handle in handles:
            handle.remove()
    total = clock() - start
    if len(evictor.kept) != len(layers):
        raise RuntimeError(
            f"{len(evictor.kept)} of {len(layers)} decoder layers were evicted during the prefill"
        )
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
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token_layer = 2 * config.num_key_value_heads * head_dim * dtype_bytes  # keys + values
    layers = config.num_hidden_layers
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
