"""The one interface every eviction method implements: per-layer, per-KV-head scores over the prompt.

A press may ask for attention to be captured during the prompt's prefill (SnapKV's observation window,
TOVA's last query, H2O's every query) and then scores the prompt from that capture, from the prefilled
cache, or by running more tokens on top of it (LookaheadKV's lookahead step, LAQ's pseudo response).
Turning scores into a compressed cache is the shared selector's job, never the press's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.attention import AttentionCapture
from lkv.core.cache import AppendedKV


@dataclass
class PressContext:
    """Everything a press may read after the prompt's prefill.

    Attributes:
        model: the frozen model (adapters, if any, disabled).
        prompt_ids: ``(1, S)`` prompt tokens.
        cache: the prompt's full cache, ``S`` entries; a press that appends tokens must crop it back.
        next_logits: ``(1, vocab)`` logits after the prompt.
        capture: the press's prefill capture (``None`` if it asked for none).
        eos_token_ids: stop tokens, for presses that generate (Oracle, LAQ, SpecKV).
        tokenizer: the model's tokenizer, for presses that write text of their own (KVzip's repeat prompt).
    """

    model: PreTrainedModel
    prompt_ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    capture: AttentionCapture | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    tokenizer: PreTrainedTokenizerBase | None = None

    @property
    def prompt_len(self) -> int:
        return self.prompt_ids.shape[1]


@dataclass
class StreamContext:
    """What a press may read while the prompt is prefilled layer by layer (:mod:`lkv.eviction.streamed`).

    Attributes:
        model: the frozen model (adapters, if any, disabled).
        prompt_ids: ``(1, S)`` prompt tokens.
        cache: the cache being filled: when layer ``l`` is scored, layer ``l`` holds the prompt's ``S``
            entries, earlier layers their compressed ones, later layers nothing yet.
        capture: the press's prefill capture (``None`` if it asked for none); layer ``l`` has been observed.
    """

    model: PreTrainedModel
    prompt_ids: torch.Tensor
    cache: DynamicCache
    capture: AttentionCapture | None = None

    @property
    def prompt_len(self) -> int:
        return self.prompt_ids.shape[1]


LayerScorer = Callable[[int], torch.Tensor]


class Press(ABC):
    """An eviction method: scores ``(1, layers, kv_heads, S)``, higher = keep.

    Selection options a method needs by definition (SnapKV always keeps its window, StreamingLLM its
    sink) are reported by :meth:`protected`; the selector merges them with the user's options.
    """

    name: str = "press"
    # True when layer l's scores depend on layers ≤ l only (layer-streamed eviction: :meth:`layer_scorer`)
    streamable: ClassVar[bool] = False

    def prefill_capture(self, prompt_len: int) -> AttentionCapture | None:
        """Capture to attach to the prompt's prefill, or ``None``."""
        return None

    def score_key(self) -> Hashable | None:
        """A key that is equal for presses whose :meth:`score` gives the same scores of any prompt on one model
        (KVzip's and RestoreKV's eviction: one reconstruction pass serves both), or ``None``: scored alone
        (the default; a press whose scores read its own capture or weights)."""
        return None

    @abstractmethod
    def score(self, ctx: PressContext) -> torch.Tensor:
        """Importance ``(1, layers, kv_heads, S)`` of every prompt position (any monotone scale)."""

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        """For layer-streamed eviction: ``layer_idx → (1, kv_heads, S)`` scores of that layer, equal to
        ``score(...)[:, layer_idx]`` of the two-phase path.

        Called once before the prefill; the returned function is called for layers ``0, 1, ...`` in turn, each
        time right after the prompt has passed that layer (before the layer is cut to its budget).
        """
        raise NotImplementedError(
            f"{self.name} needs the whole prompt before it can score a layer; it has no layer-streamed eviction"
        )

    def budget_scores(self, scores: torch.Tensor, prompt_ids: torch.Tensor, budget: int) -> torch.Tensor:
        """The scores the selector ranks when each KV head keeps ``budget`` entries: ``scores (1, [layers,]
        kv_heads, S)`` from :meth:`score` (or one layer's from :meth:`layer_scorer`) of the ``(1, S)`` prompt
        ``prompt_ids`` → the same shape. Default: ``scores``. A press whose ranking depends on the budget (a
        sentence share from a budget on) changes them here, so one scoring serves every budget of a sweep."""
        return scores

    def protected(self, prompt_len: int) -> tuple[int, int]:
        """``(sink, recent)``: leading and trailing prompt tokens this method always keeps."""
        return 0, 0

    def appended(self, ctx: PressContext) -> AppendedKV | None:
        """Entries the method adds to the cache after evicting it (default: none), computed on the full prompt
        cache of ``ctx`` (which it must leave at ``S`` entries). They follow the prompt (the answer's positions
        start after them) and :meth:`layer_budgets` must leave them room within the budget."""
        return None

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        """Tokens kept per KV head in each layer for a per-head budget ``C`` (default: ``C`` everywhere).

        A schedule (PyramidKV) may move tokens between layers but keeps the total ``num_layers · C``; values
        at or above ``prompt_len`` mean "no eviction in that layer".
        """
        return [budget] * num_layers
