"""The one prefill of a prompt that every evaluated method scores: each method's attention capture rides on
the same forward pass (:func:`shared_prefill`)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import AttentionCapture, ImportanceCapture
from lkv.core.cache import cache_bytes
from lkv.core.clock import clock
from lkv.core.generation import prefill
from lkv.eviction.presses import Press
from lkv.eviction.records import ScoredPrompt


@dataclass
class Prefilled:
    """One prefill shared by every method: ``ids (1, S)``, the full cache and each method's capture."""

    ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    captures: dict[str, AttentionCapture | None]
    seconds: float
    # Press.score_key → (scores, seconds): presses with one key score this prefill once (EvalSetup.press_scores)
    memo: dict[Hashable, tuple[torch.Tensor, float]] = field(default_factory=dict)

    @property
    def prompt_len(self) -> int:
        return self.ids.shape[1]

    def scored(self, scores: torch.Tensor | None = None, score_s: float = 0.0) -> ScoredPrompt:
        """This prefill as a :class:`ScoredPrompt` with a method's ``(1, layers, kv_heads, S)`` ``scores``
        (none: FullKV) that took ``score_s`` seconds; it shares the cache (evict it, not in place, to keep it)."""
        return ScoredPrompt(
            self.ids,
            self.cache,
            self.next_logits,
            scores,
            cache_bytes(self.cache),
            self.seconds,
            score_s,
        )


@torch.no_grad()
def shared_prefill(model: PreTrainedModel, ids: torch.Tensor, presses: dict[str, Press]) -> Prefilled:
    """Prefill ``ids`` once with the captures of all ``presses``.

    Presses asking for the same attention capture (same kind, key count and query window) share one object: a
    press only reads the capture its prefill filled (LAQ/SpecKV capture their pseudo tokens in captures of
    their own). A probe's capture of the attention input is its own (it keeps only that probe's scores).
    """
    unique: dict[tuple[type, int, int | None] | int, AttentionCapture] = {}
    captures: dict[str, AttentionCapture | None] = {}
    for name, press in presses.items():
        capture = press.prefill_capture(ids.shape[1])
        if capture is not None:
            shared = isinstance(capture, ImportanceCapture)
            key = (type(capture), capture.num_keys, capture.last_queries) if shared else id(capture)
            capture = unique.setdefault(key, capture)
        captures[name] = capture
    kwargs = {"lkv_capture": list(unique.values())} if unique else {}
    start = clock(ids.device)
    cache, next_logits = prefill(model, ids, **kwargs)
    return Prefilled(ids, cache, next_logits, captures, clock(ids.device) - start)


def with_protected(scores: torch.Tensor, press: Press) -> torch.Tensor:
    """``scores (..., S)`` with the positions ``press`` always keeps (sink, recent window) set to ``+inf``."""
    prompt_len = scores.shape[-1]
    sink, recent = press.protected(prompt_len)
    out = scores.float().clone()
    out[..., :sink] = float("inf")
    if recent:
        out[..., prompt_len - recent :] = float("inf")
    return out
