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

Compressed caches (``lkv eval``) stack the same way (:func:`stack_caches`): a row's cache holds its ``C``
kept entries (plus an appended question) while its new tokens continue from the *uncompressed* prompt
length, so :class:`PaddedPrompts` carries each row's first position apart from its cache length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.cache import KEY_MASK_ATTR, CompressedCache, key_mask, select_rows
from lkv.core.clock import clock
from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill


@dataclass
class PaddedPrompts:
    """Prompts prefilled one by one and stacked into a left-padded cache.

    Attributes:
        cache: layer ``l`` holds ``(B, kv_heads, S_max, head_dim)`` keys/values; row ``b``'s prompt fills the
            last ``lengths[b]`` columns, the columns before it are zeros.
        next_logits: ``(B, vocab)`` fp32 logits after each prompt's last token.
        lengths: ``S_b``, the cached entries of each row (its prompt length, for a prefilled prompt).
        positions: position id of each row's first new token; default ``lengths`` (a compressed cache gives
            the uncompressed prompt length here, :func:`stack_caches`).
    """

    cache: DynamicCache
    next_logits: torch.Tensor
    lengths: list[int]
    positions: list[int] | None = None

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

    @property
    def first_positions(self) -> list[int]:
        """Position id of each row's first new token."""
        return self.lengths if self.positions is None else self.positions


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
    logits = []

    def prefilled() -> Iterator[DynamicCache]:
        for ids in prompts:
            own, row_logits = prefill(model, torch.tensor([list(ids)], device=device))
            logits.append(row_logits)
            yield own
            del own  # copied into the stack: released before the next prompt is prefilled

    width = max(lengths)
    cache = _left_padded(prefilled(), [width - n for n in lengths], DynamicCache(config=model.config))
    return PaddedPrompts(cache, torch.cat(logits), lengths)


def stack_layout(cache: DynamicCache) -> tuple[int, ...] | None:
    """What decides which single-row caches :func:`stack_caches` can stack: ``None`` for a cache whose layers
    all hold the same number of entries (such caches stack with left padding), else the entries per layer
    (a ragged cache, e.g. PyramidKV's, stacks only with caches of exactly the same layer lengths)."""
    lengths = tuple(layer.keys.shape[2] for layer in cache.layers)
    return None if len(set(lengths)) == 1 else lengths


def stack_caches(
    caches: Iterable[DynamicCache],
    next_logits: Sequence[torch.Tensor],
    positions: Sequence[int],
    lengths: Sequence[int] | None = None,
) -> PaddedPrompts:
    """Stack single-row caches (compressed prompts) into one left-padded batch to decode together.

    One attention mask serves every layer, so a row's padding must be the same in every layer: caches of
    uniform layers (any lengths) stack with left padding, ragged caches (PyramidKV) only with caches of the
    same :func:`stack_layout` (then there is no padding at all and no mask is needed). The inputs are copied.

    Args:
        caches: layer ``l`` of cache ``b`` holds ``(1, kv_heads, n_bl, head_dim)``. With ``lengths`` they may
            come from a generator: each is copied into the stack and let go before the next is asked for, so
            the stack and one row's own cache are all that is held at once (uniform layers only).
        next_logits: ``(1, vocab)`` each: the logits for each row's first new token.
        positions: position id of each row's first new token (the *uncompressed* prompt length, plus any
            tokens appended after compression). Both are read once every cache is copied (a generator of
            ``caches`` may fill them as it goes).
        lengths: each row's entries per layer, known before its cache is made (a generator's caches).

    Returns:
        :class:`PaddedPrompts` whose ``lengths`` are the rows' entries per layer (a ragged batch: layer 0's).
    """
    ragged = False
    if lengths is None:
        caches = list(caches)
        if not caches:
            raise ValueError("expected at least one cache to stack")
        layouts = {stack_layout(cache) for cache in caches}
        ragged = layouts != {None}
        if ragged and len(layouts) > 1:
            raise ValueError(
                f"ragged caches stack only with caches of the same layer lengths, got {len(layouts)} layouts: "
                "group them by stack_layout()"
            )
        lengths = [cache.layers[0].keys.shape[2] for cache in caches]
    width = max(lengths)
    stacked = _left_padded(caches, [width - n for n in lengths], DynamicCache())
    if not len(lengths) == len(next_logits) == len(positions):
        raise ValueError(
            f"expected as many caches ({len(lengths)}), logits ({len(next_logits)}) and positions "
            f"({len(positions)})"
        )
    if ragged:
        stacked = CompressedCache(stacked.layers)
    return PaddedPrompts(stacked, torch.cat(list(next_logits)), list(lengths), list(positions))


def _left_padded(caches: Iterable[DynamicCache], pads: Sequence[int], into: DynamicCache) -> DynamicCache:
    """``into`` filled with the single-row ``caches`` stacked along the batch: row ``b`` of layer ``l`` is
    ``pads[b]`` zero columns, then the row's own entries (the same ``pads[b]`` in every layer). Rows' key masks
    (:mod:`lkv.core.cache`) are stacked too (padding columns unmasked there: the attention mask blocks them).

    No reference to a row's cache outlives its copy (a generator may make the next row meanwhile)."""
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    masks: dict[int, torch.Tensor] = {}
    row = 0
    for own in caches:
        _copy_row(own, row, pads, keys, values, masks)
        row += 1
        del own
    if row != len(pads):
        raise ValueError(f"expected {len(pads)} caches to stack, got {row}")
    for index in range(len(keys)):
        into.update(keys[index], values[index], index)
        keys[index] = values[index] = None  # the cache holds its own copy now
        setattr(into.layers[index], KEY_MASK_ATTR, masks.get(index))
    return into


def _copy_row(
    own: DynamicCache,
    row: int,
    pads: Sequence[int],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    masks: dict[int, torch.Tensor],
) -> None:
    """Copy ``own``'s entries into row ``row`` of the stacked ``keys``/``values`` (allocated at row 0), and its
    layers' key masks into ``masks`` (layer → ``(batch, kv_heads, columns)``, made on a layer's first mask)."""
    for index, layer in enumerate(own.layers):
        entries = layer.keys.shape[2]
        if row == 0:
            shape = (len(pads), layer.keys.shape[1], pads[0] + entries, layer.keys.shape[3])
            keys.append(layer.keys.new_zeros(shape))
            values.append(layer.values.new_zeros(shape[:3] + (layer.values.shape[3],)))
        if pads[row] + entries != keys[index].shape[2]:
            raise ValueError(
                f"row {row}, layer {index}: {entries} entries after {pads[row]} columns of padding do not fill "
                f"the stack's {keys[index].shape[2]} columns (its announced length is wrong, or its layers differ)"
            )
        keys[index][row, :, pads[row] :] = layer.keys[0]
        values[index][row, :, pads[row] :] = layer.values[0]
        mask = key_mask(layer, entries)
        if mask is not None:
            stacked = masks.setdefault(index, keys[index].new_ones(keys[index].shape[:3], dtype=torch.bool))
            stacked[row, :, pads[row] :] = mask[0]


@dataclass
class Finished:
    """One row of :func:`greedy_batch` that has stopped.

    Attributes:
        row: its index in the batch as given.
        tokens: the generated tokens (an ending EOS included).
        prompt_cache: the row's own prompt cache, ``(1, kv_heads, S_b, head_dim)`` per layer (a copy); bit for
            bit the cache a batch-1 prefill of the prompt gives. ``None`` unless asked for (``keep_prompt``).
        seconds: the row's share of the decoding time: each step's seconds divided among the rows it ran.
    """

    row: int
    tokens: list[int]
    prompt_cache: DynamicCache | None
    seconds: float = 0.0


StopRule = Callable[[list[int]], bool]


@torch.no_grad()
def greedy_batch(
    model: PreTrainedModel,
    padded: PaddedPrompts,
    max_new_tokens: int | Sequence[int],
    eos_token_ids: Sequence[int] = (),
    stop: Sequence[StopRule | None] | None = None,
    keep_prompt: bool = True,
) -> Iterator[Finished]:
    """Greedy responses of every row of ``padded``, yielded as each row stops (shortest first).

    Semantics per row are those of :func:`lkv.core.generation.decode` with the greedy sampler: a row stops
    after emitting an EOS token, its ``max_new_tokens``-th token, or when its ``stop`` rule says so; the last
    token is never fed back. Row ``b``'s ``t``-th new token gets position id ``padded.first_positions[b] + t``.
    ``padded.cache`` grows while decoding and loses finished rows: use it for nothing else afterwards.

    Args:
        max_new_tokens: one limit for every row, or one per row.
        stop: per row, ``None`` or a rule called with the row's tokens so far after each one (``True`` ends
            the row), as :func:`~lkv.core.generation.decode`'s ``stop``.
        keep_prompt: cut each finished row's own prompt cache out of the batch (:attr:`Finished.prompt_cache`).

    Yields:
        :class:`Finished` for each row, once.
    """
    rows = len(padded.lengths)
    limits = [max_new_tokens] * rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
    rules = [None] * rows if stop is None else list(stop)
    if len(limits) != rows or len(rules) != rows:
        raise ValueError(f"got {len(limits)} limits and {len(rules)} stop rules for {rows} rows")
    if min(limits) <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    device = padded.next_logits.device
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    cache, next_logits = padded.cache, padded.next_logits
    live = list(range(rows))  # original row index of each row of the cache
    positions = torch.tensor(padded.first_positions, device=device)  # (live,) first new position per row
    last_step = torch.tensor(limits, device=device) - 1  # (live,)
    # Without padding the mask is all ones: leave it out, as batch 1 does (and as a ragged cache needs).
    mask = padded.attention_mask() if padded.padding_fraction > 0 else None
    tokens: list[list[int]] = [[] for _ in live]
    seconds = [0.0] * rows
    started = clock(device)
    for step in range(max(limits)):
        chosen = next_logits.argmax(dim=-1)  # (live,)
        stops = torch.isin(chosen, eos) | (last_step == step)
        for index, token in enumerate(chosen.tolist()):
            row = live[index]
            tokens[row].append(token)
            if rules[row] is not None and rules[row](tokens[row]):
                stops[index] = True
        now = clock(device)
        for row in live:  # the step (the forward before it and this choice) ran every live row
            seconds[row] += (now - started) / len(live)
        started = now
        stopped = stops.nonzero().flatten().tolist()
        for index in stopped:
            row = live[index]
            # no local keeps the row's prompt copy: once the caller lets it go, it is gone
            yield Finished(
                row,
                tokens[row],
                row_prompt_cache(cache, index, padded.lengths[row], padded.width) if keep_prompt else None,
                seconds[row],
            )
        if len(stopped) == len(live):
            return
        if stopped:
            keep = (~stops).nonzero().flatten()
            select_rows(cache, keep)
            live = [live[i] for i in keep.tolist()]
            chosen, positions, last_step = chosen[keep], positions[keep], last_step[keep]
            mask = None if mask is None else mask[keep]
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
        started = clock(device)
        out = model(
            input_ids=chosen[:, None],
            attention_mask=mask,
            position_ids=(positions + step)[:, None],  # each row continues from its own (uncompressed) length
            **cache_kwargs(cache),
            use_cache=True,
        )
        next_logits = out.logits[:, -1].float()
