"""What one prompt becomes on its way through eviction: :class:`ScoredPrompt` (prefilled and scored) →
:class:`CompressedPrompt` (evicted to a budget) → :class:`Generation` (an answer and its costs).

The :class:`~lkv.eviction.compressor.Compressor` makes the first two; every decode path (the Compressor's
one-at-a-time decoding, :mod:`lkv.eval.batched_decode`) records its answers with :func:`answer_record`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from lkv.core.budget import Budget


@dataclass
class CompressedPrompt:
    """A prompt's cache after eviction, ready to decode from (or to append a question to).

    Attributes:
        cache: the (compressed) cache; layer ``l`` holds ``(1, kv_heads, C_l, head_dim)``.
        next_logits: ``(1, vocab)`` logits after the last prompt token.
        prompt_len: ``S``, the uncompressed length: new tokens get position ids ``S, S+1, ...``; with ``n``
            entries a method appended after eviction (:meth:`~lkv.eviction.presses.base.Press.appended`),
            ``S + n`` (they sit at ``S..S+n-1``).
        kept: per layer ``(1, kv_heads, C_l)`` the position of each cache slot (the kept prompt positions
            ascending, ``-1`` for a padding slot of an ``adaptive`` head budget, then any appended entries'
            ``S..S+n-1``), or ``None`` when nothing was evicted.
        scores: the press's ``(1, layers, kv_heads, S)`` scores, or ``None`` when nothing was evicted.
        kv_bytes_full, kv_bytes_kept: bytes of the key/value tensors before and after eviction (allocated:
            padding slots of an ``adaptive`` head budget included).
        prefill_s, eviction_s: seconds spent in the prefill and in scoring + selection + gathering.
        layer_budgets: the method's tokens per KV head in each layer for that budget (``≥ S``: the layer is
            whole).
        budget: the budget requested (``None``: not compressed to a budget).
    """

    cache: DynamicCache
    next_logits: torch.Tensor
    prompt_len: int
    kept: list[torch.Tensor] | None
    scores: torch.Tensor | None
    kv_bytes_full: int
    kv_bytes_kept: int
    prefill_s: float
    eviction_s: float
    layer_budgets: list[int]
    budget: Budget | None = None

    @property
    def kept_per_layer(self) -> list[float]:
        """Cached prompt entries per KV head in each layer (the mean over heads; padding slots not counted)."""
        if self.kept is None:  # nothing evicted (read from the budgets: a decoded row's cache may be gone)
            return [self.prompt_len] * len(self.layer_budgets)
        return [int((index >= 0).sum()) / index.shape[1] for index in self.kept]

    @property
    def kept_std(self) -> float:
        """Standard deviation (population) of the cached prompt entries over every (layer, KV head): 0 when all
        keep the same count; head budgets other than ``equal`` and layer schedules spread them."""
        if self.kept is None:
            return 0.0
        counts = torch.cat([(index >= 0).sum(dim=-1).flatten() for index in self.kept]).double()
        return float(counts.std(correction=0))


@dataclass
class ScoredPrompt:
    """A prefilled prompt and its press's scores, before eviction (one prefill serves many budgets).

    Attributes:
        ids: ``(1, S)`` prompt tokens.
        cache: the full prompt cache, ``S`` entries per layer.
        next_logits: ``(1, vocab)`` logits after the last prompt token.
        scores: ``(1, layers, kv_heads, S)``, or ``None`` when scoring was skipped (nothing to evict).
        kv_bytes_full: bytes of the full cache's key/value tensors.
        prefill_s, score_s: seconds of the prefill and of ``press.score``.
    """

    ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    scores: torch.Tensor | None
    kv_bytes_full: int
    prefill_s: float
    score_s: float

    @property
    def prompt_len(self) -> int:
        return self.ids.shape[1]


@dataclass
class Generation:
    """One generated answer and what producing it cost.

    Attributes:
        text: decoded answer (special tokens skipped, cut before the first stop string).
        token_ids: generated tokens (an ending EOS included).
        finish_reason: ``eos``, ``stop`` (a stop string) or ``length`` (``max_new_tokens`` reached).
        prompt_tokens: tokens the model read before answering (context + question in the agnostic setting).
        kept_per_layer: cached prompt entries per KV head in each layer after eviction (mean over the heads).
        kv_bytes_full, kv_bytes_kept: prompt K/V bytes before and after eviction.
        prefill_s, eviction_s, question_s, decode_s: seconds per phase (``question_s``: appending the
            question to a compressed context, 0 when question-aware).
        kept_std: the spread of the cached prompt entries over every (layer, KV head)
            (:attr:`CompressedPrompt.kept_std`).
        cache_lengths: the most entries per KV head any layer held before decoding, then after each generated
            token's forward pass (and the decode-time policy's eviction, if any).
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    kept_per_layer: list[float]
    kv_bytes_full: int
    kv_bytes_kept: int
    prefill_s: float
    eviction_s: float
    question_s: float = 0.0
    decode_s: float = 0.0
    kept_std: float = 0.0
    cache_lengths: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        """Time to first token: prefill + eviction (+ appending the question)."""
        return self.prefill_s + self.eviction_s + self.question_s

    def summary(self) -> str:
        """One line of the numbers above."""
        kept = sum(self.kept_per_layer) / len(self.kept_per_layer)
        return (
            f"kept {kept:.0f} tokens per head on average (KV {self.kv_bytes_kept / 2**20:.2f} of "
            f"{self.kv_bytes_full / 2**20:.2f} MiB); prefill {self.prefill_s:.2f} s, eviction "
            f"{self.eviction_s:.2f} s, question {self.question_s:.2f} s, decode {self.decode_s:.2f} s for "
            f"{len(self.token_ids)} tokens ({self.finish_reason})"
        )


def answer_record(
    compressed: CompressedPrompt,
    text: str,
    token_ids: list[int],
    finish_reason: str,
    prompt_tokens: int,
    question_s: float,
    decode_s: float,
    cache_lengths: Sequence[int] = (),
) -> Generation:
    """The :class:`Generation` of an answer decoded from ``compressed`` (every decode path builds it here).

    Args:
        prompt_tokens: tokens read before answering (the prompt, plus an appended question).
        question_s, decode_s: seconds spent appending the question (0 when question-aware) and decoding.
        cache_lengths: the decode-time trace of the cache length (empty where none is kept).
    """
    return Generation(
        text=text,
        token_ids=token_ids,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        kept_per_layer=compressed.kept_per_layer,
        kv_bytes_full=compressed.kv_bytes_full,
        kv_bytes_kept=compressed.kv_bytes_kept,
        prefill_s=compressed.prefill_s,
        eviction_s=compressed.eviction_s,
        question_s=question_s,
        decode_s=decode_s,
        kept_std=compressed.kept_std,
        cache_lengths=list(cache_lengths),
    )
