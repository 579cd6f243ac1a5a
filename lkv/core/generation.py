"""Prefill, token-by-token decoding and appending a block of tokens over an explicit KV cache; an answer's text
and why it ended (:func:`answer_text`).

Decoding takes its position ids from the *original* sequence length, not from the cache length, so the
same loop serves a full cache, one that eviction has shrunk to a budget, and one that a decode-time policy
(:mod:`lkv.eviction.decoding`) keeps shrinking while it generates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.cache import CompressedCache
from lkv.core.compat import cache_kwargs

Sampler = Callable[[torch.Tensor], torch.Tensor]


class CacheUpkeep(Protocol):
    """What :func:`decode` asks of a decode-time policy (one object per generation, :mod:`lkv.eviction.decoding`).

    Around every forward pass on the cache: ``forward_kwargs`` adds keyword arguments to it (an attention
    capture, a sparse-attention policy), ``observe`` reads what they collected, ``enforce`` evicts when the
    cache is over its budget and returns the cache to continue with.
    """

    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        """Extra forward arguments; ``generating`` is false for a block appended before decoding."""
        ...

    def observe(self) -> None:
        """Take in what the last forward pass captured."""
        ...

    def enforce(self, cache: DynamicCache) -> DynamicCache:
        """Evict down to the budget if the cache is over it; the cache to use from now on."""
        ...


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Pick the arg-max token: ``logits (batch, vocab)`` → ``(batch,)``."""
    return logits.argmax(dim=-1)


def make_sampler(temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> Sampler:
    """Greedy for ``temperature == 0``, else nucleus sampling from ``softmax(logits / temperature)``.

    Args:
        temperature: ≥ 0; 0 means greedy (``top_p`` and ``seed`` are then unused).
        top_p: keep the smallest set of most likely tokens whose probability reaches ``top_p`` (0 < top_p ≤ 1).
        seed: seeds the sampler's own generator, so a run is reproducible whatever else draws random numbers;
            ``None`` draws a non-deterministic seed.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        return greedy
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # a fresh Generator always starts from the same default seed
    else:
        generator.manual_seed(seed)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token once the mass before it already reaches top_p (the most likely token always stays).
        sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, 0.0)
        choice = torch.multinomial(sorted_probs.cpu(), 1, generator=generator).to(order.device)
        return order.gather(-1, choice)[..., 0]

    return sample


@dataclass(frozen=True)
class Sampling:
    """How one answer is drawn, passed as one value through ``generate`` / ``decode`` / ``answer``.

    Attributes:
        max_new_tokens: longest answer in tokens; it also ends at EOS and at any of ``stop``.
        temperature: 0 = greedy; otherwise the softmax temperature of nucleus sampling.
        top_p: nucleus mass kept when sampling (0 < top_p ≤ 1).
        seed: seed of the sampler's own generator (``None``: non-deterministic).
        stop: strings that end the answer besides EOS (need a tokenizer).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        object.__setattr__(
            self, "stop", tuple(self.stop)
        )  # a list from YAML/CLI hashes and compares as a tuple
        make_sampler(self.temperature, self.top_p, self.seed)  # checks temperature and top_p

    def sampler(self) -> Sampler:
        """A fresh sampler (its own generator, so each answer restarts from ``seed``)."""
        return make_sampler(self.temperature, self.top_p, self.seed)


GREEDY = Sampling()


class StopStrings:
    """``stop`` callback for :func:`decode`: true once the decoded text contains any of ``strings``.

    Only the tail of the tokens is decoded each step (enough tokens to span the longest string).
    """

    def __init__(self, tokenizer, strings: Sequence[str]) -> None:
        self.strings = [text for text in strings if text]
        self.tokenizer = tokenizer
        self.tail = max((len(text) for text in self.strings), default=0) + 2

    def __call__(self, tokens: list[int]) -> bool:
        if not self.strings:
            return False
        text = self.tokenizer.decode(tokens[-self.tail :], skip_special_tokens=False)
        return any(stop in text for stop in self.strings)

    def truncate(self, text: str) -> str:
        """``text`` up to (excluding) the first stop string."""
        cut = min((i for i in (text.find(stop) for stop in self.strings) if i >= 0), default=len(text))
        return text[:cut]


def answer_text(
    tokenizer: PreTrainedTokenizerBase | None,
    tokens: list[int],
    eos_token_ids: Sequence[int],
    stopper: StopStrings | None = None,
) -> tuple[str, str]:
    """``(text, finish_reason)`` of generated ``tokens``: special tokens skipped, the text cut before the first
    stop string; the reason is ``eos``, ``stop`` (a stop string) or ``length``."""
    text = "" if tokenizer is None else tokenizer.decode(tokens, skip_special_tokens=True)
    if tokens[-1] in eos_token_ids:
        return text, "eos"
    if stopper is not None and stopper(tokens):
        return stopper.truncate(text), "stop"
    return text, "length"


@torch.no_grad()
def prefill(
    model: PreTrainedModel, input_ids: torch.Tensor, cache: DynamicCache | None = None, **kwargs
) -> tuple[DynamicCache, torch.Tensor]:
    """Run the prompt once and return its KV cache and the next-token logits.

    The LM head is applied to the last position only (``logits_to_keep=1``): no ``S × vocab`` logits.

    Args:
        input_ids: ``(batch, S)`` prompt tokens.
        cache: an empty cache to fill (default: a new one); hooks may already hold it (layer-streamed eviction).
        kwargs: extra forward arguments (e.g. ``lkv_capture=...``).

    Returns:
        ``cache`` holding ``(batch, kv_heads, S, head_dim)`` per layer, and logits ``(batch, vocab)`` in fp32.
    """
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (batch, S) with S ≥ 1, got shape {tuple(input_ids.shape)}")
    cache = DynamicCache(config=model.config) if cache is None else cache
    out = model(input_ids=input_ids, **cache_kwargs(cache), use_cache=True, logits_to_keep=1, **kwargs)
    return cache, out.logits[:, -1].float()


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    cache: DynamicCache,
    next_logits: torch.Tensor,
    position: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int] = (),
    sampler: Sampler = greedy,
    stop: Callable[[list[int]], bool] | None = None,
    upkeep: CacheUpkeep | None = None,
) -> list[int]:
    """Generate up to ``max_new_tokens`` for a single sequence from a prefilled cache.

    Args:
        cache: the prompt's cache (full or compressed); it grows by one entry per generated token.
        next_logits: ``(1, vocab)`` logits for the first new token (from :func:`prefill`).
        position: position id of the first new token = the *uncompressed* prompt length.
        eos_token_ids: generation stops after emitting any of these (the EOS token is returned).
        sampler: ``logits (1, vocab) → (1,)`` token choice (:func:`greedy`, :func:`make_sampler`).
        stop: called with the tokens so far after each one; ``True`` ends generation (e.g. :class:`StopStrings`).
        upkeep: a decode-time policy's per-generation state: it joins every forward pass and may evict
            after it (the cache object may then be replaced; positions still continue from ``position``).

    Returns:
        The generated token ids.
    """
    if next_logits.shape[0] != 1:
        raise ValueError(f"decode handles one sequence at a time, got batch {next_logits.shape[0]}")
    eos = set(eos_token_ids)
    tokens: list[int] = []
    device = next_logits.device
    for step in range(max_new_tokens):
        token = sampler(next_logits)
        tokens.append(int(token))
        if tokens[-1] in eos or step == max_new_tokens - 1 or (stop is not None and stop(tokens)):
            break
        out = model(
            input_ids=token.view(1, 1),
            position_ids=torch.tensor([[position + step]], device=device),
            **cache_kwargs(cache),
            use_cache=True,
            **({} if upkeep is None else upkeep.forward_kwargs(generating=True)),
        )
        if upkeep is not None:
            upkeep.observe()
            cache = upkeep.enforce(cache)
        next_logits = out.logits[:, -1].float()
    return tokens


@torch.no_grad()
def append_tokens(
    model: PreTrainedModel,
    cache: DynamicCache,
    ids: torch.Tensor,
    position: int,
    upkeep: CacheUpkeep | None = None,
) -> torch.Tensor:
    """Run ``ids (1, n)`` on top of ``cache`` at positions ``position..position+n-1``; next-token logits ``(1, vocab)``.

    transformers sizes the causal mask from the cache (query offset = cached entries), so a block appended
    to a uniformly compressed cache gets the right mask whatever its positions. Layers of different lengths
    (PyramidKV) need a mask per layer, so such a cache takes the block one token at a time.

    A decode-time policy's ``upkeep`` observes every forward pass (nothing is evicted here: call its
    ``enforce`` afterwards).
    """
    ragged = isinstance(cache, CompressedCache) and cache.is_ragged
    steps = [ids[:, i : i + 1] for i in range(ids.shape[1])] if ragged else [ids]
    offset = position
    for block in steps:
        positions = torch.arange(offset, offset + block.shape[1], device=ids.device)[None]
        extra = {} if upkeep is None else upkeep.forward_kwargs(generating=False)
        out = model(
            input_ids=block,
            position_ids=positions,
            **cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        if upkeep is not None:
            upkeep.observe()
        offset += block.shape[1]
    return out.logits[:, -1].float()


def crop_to(cache: DynamicCache, length: int) -> None:
    """Shrink ``cache`` to its first ``length`` positions (transformers' ``crop`` takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} tokens to {length}")
    if extra:
        cache.crop(-extra)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> list[int]:
    """All end-of-sequence ids the model or tokenizer (if any) declare (chat models often have several)."""
    found = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = set(found if isinstance(found, list) else [] if found is None else [found])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)
