"""Greedy decoding of several prompts at once from one left-padded KV cache.

Each prompt is prefilled on its own (:func:`lkv.core.generation.prefill`, exactly as at batch 1: on a GPU one
long prompt already fills the device, and no prefill FLOPs go to padding), and the prompt caches are stacked
into one cache, left-padded to the longest prompt::

    row 0:  [pad pad  x0 x1 x2 x3 x4 | y0 y1 ...]      prompt of 5 tokens, 2 columns of padding
    row 1:  [x0  x1   x2 x3 x4 x5 x6 | y0 y1 ...]      the longest prompt (7 tokens)

Decoding then runs every live row in one forward pass per step. A padded row sees its padding only through
the attention mask (0 on the pad columns, so their zero keys get no attention) and its new tokens continue
from its *own* length: position ``S_b + t`` for the t-th token of row b, not ``S_max + t``. Each row stops at
its own EOS or after ``max_new_tokens``; a finished row leaves the batch at once (its cache row is dropped,
so later steps do no work for it).

Memory: one ``(B, kv_heads, S_max + t, head_dim)`` tensor per layer for K and for V, i.e.
O(layers · kv_heads · S) per prompt plus the padding; no ``S × S`` matrix anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.generation import prefill


@dataclass
class PaddedPrompts:
    """Prompts prefilled one by one and stacked into a left-padded cache.

    Attributes:
        cache: layer ``l`` holds ``(B, kv_heads, S_max, head_dim)`` keys/values; row ``b``'s prompt fills the
            last ``lengths[b]`` columns, the columns before it are zeros.
        next_logits: ``(B, vocab)`` fp32 logits after each prompt's last token.
        lengths: ``S_b``, the prompt lengths.
    """

    cache: DynamicCache
    next_logits: torch.Tensor
    lengths: list[int]

    @property
    def width(self) -> int:
        """``S_max``, the padded prompt length."""
        return max(self.lengths)

    @property
    def padding_fraction(self) -> float:
        """Share of the stacked prompt cache that is padding: ``1 - Σ S_b / (B · S_max)``."""
        return 1 - sum(self.lengths) / (len(self.lengths) * self.width)

    def attention_mask(self) -> torch.Tensor:
        """``(B, S_max)`` long: 1 on each row's prompt columns, 0 on its left padding."""
        columns = torch.arange(self.width, device=self.next_logits.device)
        starts = self.width - torch.tensor(self.lengths, device=self.next_logits.device)
        return (columns[None, :] >= starts[:, None]).long()

    def prompt_cache(self, row: int) -> DynamicCache:
        """Row ``row``'s own prompt cache (a copy): see :func:`row_prompt_cache`."""
        return row_prompt_cache(self.cache, row, self.lengths[row], self.width)


def row_prompt_cache(cache: DynamicCache, row: int, length: int, width: int) -> DynamicCache:
    """One row's prompt out of a left-padded cache: ``(1, kv_heads, length, head_dim)`` per layer (a copy).

    Args:
        cache: ``(B, kv_heads, ≥ width, head_dim)`` per layer; the row's prompt fills columns
            ``width - length .. width - 1``.
    """
    own = DynamicCache()
    for index, layer in enumerate(cache.layers):
        own.update(
            layer.keys[row : row + 1, :, width - length : width],
            layer.values[row : row + 1, :, width - length : width],
            index,
        )
    return own


@torch.no_grad()
def prefill_padded(model: PreTrainedModel, prompts: Sequence[Sequence[int]]) -> PaddedPrompts:
    """Prefill each prompt at batch 1 and stack the caches, left-padded (see the module docstring).

    Peak memory is the stacked cache plus one prompt's own cache and prefill activations.
    """
    if not prompts or any(len(ids) == 0 for ids in prompts):
        raise ValueError(f"expected one or more non-empty prompts, got lengths {[len(p) for p in prompts]}")
    device = next(model.parameters()).device
    lengths = [len(ids) for ids in prompts]
    width = max(lengths)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits = []
    for row, ids in enumerate(prompts):
        own, row_logits = prefill(model, torch.tensor([list(ids)], device=device))
        logits.append(row_logits)
        for index, layer in enumerate(own.layers):
            if row == 0:
                shape = (len(prompts), layer.keys.shape[1], width, layer.keys.shape[3])
                keys.append(layer.keys.new_zeros(shape))
                values.append(layer.values.new_zeros(shape[:3] + (layer.values.shape[3],)))
            keys[index][row, :, width - len(ids) :] = layer.keys[0]
            values[index][row, :, width - len(ids) :] = layer.values[0]
        del own
    cache = DynamicCache(config=model.config)
    for index in range(len(keys)):
        cache.update(keys[index], values[index], index)
        keys[index] = values[index] = None  # the cache holds its own copy now
    return PaddedPrompts(cache, torch.cat(logits), lengths)


@dataclass
class Finished:
    """One row of :func:`greedy_batch` that has stopped.

    Attributes:
        row: its index in the batch as given.
        tokens: the generated tokens (an ending EOS included).
        prompt_cache: the row's own prompt cache, ``(1, kv_heads, S_b, head_dim)`` per layer (a copy); bit for
            bit the cache a batch-1 prefill of the prompt gives.
    """

    row: int
    tokens: list[int]
    prompt_cache: DynamicCache


@torch.no_grad()
def greedy_batch(
    model: PreTrainedModel, padded: PaddedPrompts, max_new_tokens: int, eos_token_ids: Sequence[int] = ()
) -> Iterator[Finished]:
    """Greedy responses of every row of ``padded``, yielded as each row stops (shortest first).

    Semantics per row are those of :func:`lkv.core.generation.decode` with the greedy sampler: a row stops
    after emitting an EOS token or its ``max_new_tokens``-th token; the last token is never fed back.
    ``padded.cache`` grows while decoding and loses finished rows: use it for nothing else afterwards.

    Yields:
        :class:`Finished` for each row, once.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=padded.next_logits.device)
    cache, next_logits = padded.cache, padded.next_logits
    live = list(range(len(padded.lengths)))  # original row index of each row of the cache
    lengths = torch.tensor(padded.lengths, device=next_logits.device)  # (live,) S_b of each row
    mask = padded.attention_mask()
    tokens: list[list[int]] = [[] for _ in live]
    for step in range(max_new_tokens):
        chosen = next_logits.argmax(dim=-1)  # (live,)
        stops = torch.isin(chosen, eos) | (step == max_new_tokens - 1)
        for position, token in enumerate(chosen.tolist()):
            tokens[live[position]].append(token)
        stopped = stops.nonzero().flatten().tolist()
        for position in stopped:
            row = live[position]
            prompt = row_prompt_cache(cache, position, padded.lengths[row], padded.width)
            yield Finished(row, tokens[row], prompt)
        if len(stopped) == len(live):
            return
        if stopped:
            keep = (~stops).nonzero().flatten()
            cache.batch_select_indices(keep)
            live = [live[i] for i in keep.tolist()]
            chosen, lengths, mask = chosen[keep], lengths[keep], mask[keep]
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        out = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=(lengths + step)[:, None],  # each row continues from its own prompt length
            cache=cache,
            use_cache=True,
        )
        next_logits = out.logits[:, -1].float()
