"""The (sample, setting) units of an end task (:class:`Unit`) and the most cached tokens a chunk of them may
stack on the device (:func:`device_batch_tokens`): a chunk's full caches are held together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.core.budget import Budget
from lkv.core.cache import token_bytes
from lkv.core.generation import Sampling
from lkv.eval.prefill import Prefilled
from lkv.eval.tasks import Sample
from lkv.eviction.records import ScoredPrompt

# Share of the device's free memory that a chunk's stacked full caches may take when no max_batch_tokens is
# given; the rest is for one prompt's cache copy (at most the stack's size), the prefill's activations, the
# evicted caches waiting to be decoded and the allocator's slack (docs/scale_out.md, "Evaluation memory").
CACHE_SHARE = 0.5


def device_batch_tokens(model: PreTrainedModel, share: float = CACHE_SHARE) -> int | None:
    """The most cached tokens a chunk may stack: ``share`` of the free device memory over one token's K/V bytes
    in every layer (:func:`lkv.core.cache.token_bytes`); None (no limit) off CUDA."""
    parameter = next(model.parameters())
    if parameter.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(parameter.device)
    # memory the caching allocator holds but no tensor uses is free for the caches too
    free += torch.cuda.memory_reserved(parameter.device) - torch.cuda.memory_allocated(parameter.device)
    per_token = token_bytes(model.config.get_text_config(), parameter.element_size())
    return max(1, int(share * free / per_token))


@dataclass
class Unit:
    """One (sample, setting) with rows to make, and what the runner computes for it on the way."""

    sample: Sample
    setting: str
    context: list[int]
    question: list[int]
    todo: list[tuple[str, Budget | None]]
    streams: set[str] = field(default_factory=set)
    shared: Prefilled | None = None
    full: dict[str, Any] | None = None
    scored: dict[str, ScoredPrompt] | None = None

    @property
    def entries(self) -> int:
        """Cached entries when its answer starts: the prompt and, question-agnostic, the appended question."""
        return len(self.context) + len(self.question)

    @property
    def prompt(self) -> list[int]:
        """The tokens prefilled (and compressed): context + question when aware, the context when agnostic."""
        return self.context + self.question if self.setting == "aware" else self.context

    @property
    def appended(self) -> list[int]:
        """Tokens appended to the compressed cache: the question when agnostic, else none."""
        return [] if self.setting == "aware" else self.question

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_new_tokens=self.sample.max_new_tokens, stop=tuple(self.sample.stop))

    def full_scored(self, scores: torch.Tensor | None = None, score_s: float = 0.0) -> ScoredPrompt:
        """The shared prefill as a :class:`ScoredPrompt` with a method's ``scores`` (none: FullKV)."""
        return self.shared.scored(scores, score_s)
