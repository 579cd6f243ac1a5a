"""KVzip+ importance: what a "repeat the context" pass draws from each prompt KV pair (KVzap's target).

KVzip (arXiv:2505.23416) scores a prompt's KV pairs by the attention the model pays them while it reconstructs
the prompt: on top of the prompt's cache it runs a block ``"\\n\\nRepeat the previous context exactly."`` +
the chat template's closing + the prompt's own tokens, teacher-forced. KVzap (arXiv:2601.07891; NVIDIA
kvpress's ``kvzap/data.py``) trains its per-token probes to regress the log of the *KVzip+* score, which
weights each probability by what the key's value adds to the layer's output relative to the size of the
query's input:

    s⁺[l, h, j] = log max over the query heads q of KV head h and the repeated tokens t of
                  a_l[q, t, j] · ‖v_l[h, j] W_o,l^q‖ / ‖x_l[t]‖

with ``a`` the softmax attention of reconstruction query ``t`` on prompt key ``j`` (over every key, the
block's included), ``W_o^q`` the output projection's slice of query head ``q`` and ``x_l[t]`` the attention
input of query ``t`` (after the layer's input norm). Only the repeated tokens' queries count, not the
instruction's.

Here the repeated tokens are the whole prompt as it was prefilled (chat template tokens included), so every
one of its ``S`` positions gets a score; kvpress repeats the context between the template's opening and
closing and cuts contexts longer than 2K tokens into chunks, which lkv's ~1K-token training prompts do not
need.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.attention import ImportanceCapture, grouped_attention, query_blocks
from lkv.core.chat import encode_question
from lkv.core.compat import cache_kwargs
from lkv.core.generation import crop_to

REPEAT_INSTRUCTION = "Repeat the previous context exactly."


def reconstruction_block(tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int]) -> list[int]:
    """The tokens appended to a prompt's cache to score it: the repeat instruction as a new turn (a blank
    line, :data:`REPEAT_INSTRUCTION`, the chat template's closing), then the prompt's own ``S`` tokens
    again."""
    return encode_question(tokenizer, REPEAT_INSTRUCTION) + [int(i) for i in prompt_ids]


class ReconstructionCapture(ImportanceCapture):
    """Per layer and query head, the largest attention ``a[q, t, j]`` (KVzip+: ``a[q, t, j] / ‖x[t]‖``) a
    reconstruction block's queries pay each prompt key: KVzip+'s targets (:func:`kvzip_plus_scores`) and the
    KVzip press's scores (:class:`lkv.eviction.presses.kvzip.KVzipPress`) alike.

    Weighted, it reads both the attention rows (:meth:`observe`) and the attention input
    (:meth:`observe_input`, called first by the hook of :func:`~lkv.core.attention.install_capture`). The
    parent's running sums stay empty: read :meth:`maxima`, not ``scores``.

    Args:
        num_keys: ``S``, the prompt length (the cache holds ``S`` entries before the block).
        last_queries: the block's trailing queries that count (the repeated tokens); ``None``: every query.
        window: ``(sink, start, end)``: score the prompt chunk ``start..end`` only, each query's softmax running
            over the first ``sink`` keys, the chunk's and the block's own (causally; KVzip's chunked scoring of
            one unpadded sequence, whose attention mask is not read); ``None``: every prompt key, the softmax
            over the whole cache.
        weighted: divide each query's attention by the norm of its attention input (KVzip+).
    """

    def __init__(
        self,
        num_keys: int,
        last_queries: int | None = None,
        window: tuple[int, int, int] | None = None,
        weighted: bool = True,
    ) -> None:
        super().__init__(num_keys, last_queries)
        if window is not None and not 0 <= window[0] <= window[1] < window[2] <= num_keys:
            raise ValueError(f"expected a window 0 ≤ sink ≤ start < end ≤ S={num_keys}, got {window}")
        self.window, self.weighted = window, weighted
        self._inverse_norms: dict[int, torch.Tensor] = {}
        self._maxima: dict[int, torch.Tensor] = {}

    def observe_input(self, module: nn.Module, hidden_states: torch.Tensor) -> None:
        """``1 / ‖x[t]‖`` of every block query, ``hidden_states (batch, Q, hidden)`` → ``(batch, Q)`` fp32."""
        if self.weighted:
            self._inverse_norms[module.layer_idx] = hidden_states.float().norm(dim=-1).reciprocal()

    def observe(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        value: torch.Tensor | None = None,
    ) -> None:
        """Running maximum over the counted queries (shapes as in :meth:`ImportanceCapture.observe`)."""
        inverse = None
        if self.weighted:
            if layer_idx not in self._inverse_norms:
                raise RuntimeError(
                    f"layer {layer_idx}: no attention input was observed before its attention; was the model "
                    "prepared with lkv.core.attention.install_capture()?"
                )
            inverse = self._inverse_norms.pop(layer_idx)
        first = self.first_query(layer_idx, query, key)
        batch, heads, q_len = query.shape[:3]
        if self.window is None:
            scored, mask = slice(0, self.num_keys), attention_mask
        else:
            if key.shape[2] != self.num_keys + q_len:
                raise ValueError(
                    f"layer {layer_idx}: {key.shape[2]} keys, expected the prompt's {self.num_keys} + the "
                    f"block's {q_len}"
                )
            sink, start, end = self.window
            key = torch.cat([key[:, :, :sink], key[:, :, start:end], key[:, :, -q_len:]], dim=2)
            # the block is the tail of these keys: a plain causal mask on its own columns
            scored, mask = slice(sink, sink + end - start), None
        key32 = key.float()
        best = self._maxima.get(layer_idx)
        for start, stop in query_blocks(first, q_len, batch * heads * key.shape[2]):
            probs = grouped_attention(query, key32, mask, scaling, start, stop)[..., scored]
            if inverse is not None:  # (batch, kv_heads, group, queries, S) · 1/‖x[t]‖
                probs = probs * inverse[:, None, None, start:stop, None]
            part = probs.amax(dim=3)  # the maximum over the queries
            best = part if best is None else torch.maximum(best, part)
        self._maxima[layer_idx] = best

    def maxima(self, layer_idx: int) -> torch.Tensor:
        """``(batch, kv_heads, group, S)`` (a window: ``end - start``): ``max_t a[q, t, j]`` (weighted:
        ``/ ‖x[t]‖``) of one layer, per query head."""
        if layer_idx not in self._maxima:
            raise RuntimeError(f"layer {layer_idx} was not observed (observed: {sorted(self._maxima)})")
        return self._maxima[layer_idx]


def output_norms(attention: nn.Module, values: torch.Tensor) -> torch.Tensor:
    """``‖v[h, j] W_o^q‖`` for each query head ``q`` of KV head ``h``: what value ``j`` adds to the output.

    Args:
        attention: the layer's attention module (its ``o_proj`` maps ``heads · head_dim → hidden``).
        values: ``(batch, kv_heads, S, head_dim)``.

    Returns:
        ``(batch, kv_heads, group, S)`` fp32, computed through the ``(head_dim, head_dim)`` Gram matrix of
        each head's slice of ``W_o`` (never a ``(heads, S, hidden)`` tensor).
    """
    batch, kv_heads, _, head_dim = values.shape
    weight = attention.o_proj.weight.float()  # (hidden, heads · head_dim)
    heads = weight.shape[1] // head_dim
    slices = weight.T.reshape(heads, head_dim, weight.shape[0])  # W_o^q: (head_dim, hidden) per query head
    gram = (slices @ slices.transpose(1, 2)).reshape(kv_heads, heads // kv_heads, head_dim, head_dim)
    v = values.float()
    squared = torch.einsum("bksi,kgij,bksj->bkgs", v, gram, v)
    return squared.clamp_min(0).sqrt()


@torch.no_grad()
def kvzip_plus_scores(
    model: PreTrainedModel, cache: DynamicCache, prompt_len: int, block_ids: torch.Tensor, repeated: int
) -> torch.Tensor:
    """KVzip+ log-scores of a prompt's ``S`` KV pairs (the formula of the module docstring).

    Args:
        model: prepared with :func:`~lkv.core.attention.install_capture`.
        cache: the prompt's cache, exactly ``prompt_len`` entries; restored to that length on return.
        block_ids: ``(1, Q)`` the reconstruction block (:func:`reconstruction_block`).
        repeated: its trailing tokens whose queries count (the repeated prompt, ``S`` for that block).

    Returns:
        ``(layers, kv_heads, S)`` float32 natural-log scores (``-inf`` where a key got no attention at all).
    """
    if cache.get_seq_length() != prompt_len:
        raise ValueError(f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}")
    capture = ReconstructionCapture(prompt_len, last_queries=repeated)
    try:
        model(
            input_ids=block_ids, **cache_kwargs(cache), use_cache=True, logits_to_keep=1, lkv_capture=capture
        )
        scores = []
        for index, layer in enumerate(model.get_decoder().layers):
            norms = output_norms(layer.self_attn, cache.layers[index].values[:, :, :prompt_len])
            scores.append((capture.maxima(index) * norms).amax(dim=2).log()[0])
    finally:
        crop_to(cache, prompt_len)
    return torch.stack(scores)
