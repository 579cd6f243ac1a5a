"""The one interface every eviction method implements: per-layer, per-KV-head scores over the prompt.

A press may ask for attention to be captured during the prompt's prefill (SnapKV's observation window,
TOVA's last query, H2O's every query) and then scores the prompt from that capture, from the prefilled
cache, or by running more tokens on top of it (LookaheadKV's lookahead step, LAQ's pseudo response).
Turning scores into a compressed cache is the shared selector's job, never the press's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import Capture


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
    """

    model: PreTrainedModel
    prompt_ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    capture: Capture | None = None
    eos_token_ids: list[int] = field(default_factory=list)

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
    capture: Capture | None = None

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

    def prefill_capture(self, prompt_len: int) -> Capture | None:
        """Capture to attach to the prompt's prefill, or ``None``."""
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

    def protected(self, prompt_len: int) -> tuple[int, int]:
        """``(sink, recent)``: leading and trailing prompt tokens this method always keeps."""
        return 0, 0

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        """Tokens kept per KV head in each layer for a per-head budget ``C`` (default: ``C`` everywhere).

        A schedule (PyramidKV) may move tokens between layers but keeps the total ``num_layers · C``; values
        at or above ``prompt_len`` mean "no eviction in that layer".
        """
        return [budget] * num_layers


POOLING_MODES = ("max", "avg", "avg_zero_pad")
"""1-D pooling modes: ``max``; ``avg`` over the real values under the kernel (at the prefix's edges fewer than
``kernel``); ``avg_zero_pad`` divides by ``kernel`` everywhere, counting the zero padding at the edges
(``F.avg_pool1d``'s default, as NVIDIA kvpress's SnapKV/PyramidKV pool)."""


def check_pooling(kernel: int, pooling: str) -> None:
    """Raise a clear error unless ``kernel`` is odd and ≥ 1 and ``pooling`` is one of :data:`POOLING_MODES`."""
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"pooling kernel must be an odd number ≥ 1, got {kernel}")
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}; got {pooling!r}")


def pool_scores(scores: torch.Tensor, kernel: int, mode: str = "max") -> torch.Tensor:
    """1-D pooling along the sequence (SnapKV's clustering), same length out.

    Args:
        scores: ``(..., S)``.
        kernel: odd window size; 1 returns ``scores`` unchanged.
        mode: one of :data:`POOLING_MODES`.
    """
    check_pooling(kernel, mode)
    if kernel == 1 or scores.shape[-1] == 0:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    if mode == "max":
        pooled = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        pooled = F.avg_pool1d(
            flat, kernel, stride=1, padding=kernel // 2, count_include_pad=mode == "avg_zero_pad"
        )
    return pooled.reshape(shape)
