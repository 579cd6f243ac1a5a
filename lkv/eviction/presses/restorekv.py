"""RestoreKV (arXiv 2608.01247), as NVIDIA kvpress 0.5.5's ``RestoreKVPress`` runs it: KVzip evicts, learned
restore tokens fill part of the budget.

After the prompt's prefill, KVzip scores the context (:class:`~lkv.eviction.presses.kvzip.KVzipPress`); the
``n`` restore tokens of a trained :class:`~lkv.model.restore.RestoreAdapter` run ONE pass over the full cache
with their LoRA on (:meth:`RestoreAdapter.restore`); the context is evicted by KVzip's scores and the restore
tokens' K/V are appended after the kept entries, at positions ``S..S+n-1`` (the answer's positions start at
``S + n``, as in kvpress, where they stay in the cache after the context).

The budget is matched: the ``n`` restore slots count against it. With a budget of ``C`` tokens per KV head,
each head of each layer keeps ``C − n`` context entries and the ``n`` restore entries (kvpress raises its
compression ratio by ``n / S``, evicting ``n`` more entries per head on average; with ``head_budget:
adaptive`` a layer keeps ``(C − n) · kv_heads`` context entries spread over its heads, kvpress's
``layerwise=True``). A prompt the budget holds whole (``S ≤ C``) is neither evicted nor restored.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.core.attention import AttentionCapture
from lkv.core.cache import AppendedKV
from lkv.eviction.presses.base import Press, PressContext
from lkv.eviction.presses.kvzip import KVzipPress
from lkv.model.restore import RESTORE_ADAPTER, RestoreAdapter

RESTORE_SETTINGS = ("folder", "chunk_size", "overlap", "scores")
"""The settings ``press_args`` may give ``restorekv``: its folder, KVzip's chunks (:meth:`RestoreKVPress.from_folder`)
and ``scores``, the evictor: ``kvzip`` (as published, the default) or ``lookaheadkv`` (the module of ``lkv
eval --adapter`` selects the context, the restore tokens fill their share of the budget)."""
EVICTORS = ("kvzip", "lookaheadkv")


def check_restore_folder(method: str, settings: dict[str, Any]) -> None:
    """Raise one clear error unless ``settings`` (``method``'s ``press_args``) name a restore folder whose files
    are all there and whole, and a known evictor, before any model loads."""
    folder = settings.get("folder")
    if folder is None:
        raise ValueError(
            f"press_args for {method}: give the trained restore folder, e.g. {{{method}: {{folder: PATH}}}}"
        )
    if settings.get("scores", EVICTORS[0]) not in EVICTORS:
        raise ValueError(
            f"press_args for {method}: scores: expected one of {', '.join(EVICTORS)}, got {settings['scores']!r}"
        )
    try:
        RestoreAdapter.read_folder(Path(folder))
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(f"press_args for {method}: folder: {error}") from None


class RestoreKVPress(Press):
    """An evictor's scores (KVzip as published); :meth:`appended` adds the restore tokens' K/V;
    :meth:`layer_budgets` leaves them room.

    Args:
        adapter: the trained restore module, injected into the model that prefills and decodes (its LoRA is
            off outside the restore pass).
        evictor: the press whose scores select the context entries (its selection options and budget schedule
            too): :class:`KVzipPress`, as published, or another (a :class:`~lkv.eviction.presses.lookaheadkv.
            LookaheadKVPress`: LookaheadKV selects, the restore tokens fill part of the budget).
    """

    name = "restorekv"

    def __init__(self, adapter: RestoreAdapter, evictor: Press) -> None:
        self.adapter = adapter
        self.evictor = evictor

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        model: PreTrainedModel,
        chunk_size: int = 2048,
        overlap: int = 8,
        evictor: Press | None = None,
        adapter_name: str = RESTORE_ADAPTER,
    ) -> RestoreKVPress:
        """Load a restore folder (:mod:`lkv.model.restore`) on top of ``model`` (modified in place: its LoRA
        joins as the peft adapter ``adapter_name``, kvpress's name by default; ``model`` may already carry a
        lookahead module's or another restore module's, each under its own name); the evictor is KVzip with
        ``chunk_size`` and ``overlap`` unless ``evictor`` is given."""
        adapter = RestoreAdapter.load(folder, model, adapter_name=adapter_name)
        return cls(adapter, KVzipPress(chunk_size, overlap) if evictor is None else evictor)

    @property
    def num_tokens(self) -> int:
        """``n``, the restore tokens (slots per KV head taken from the budget)."""
        return self.adapter.config.num_tokens

    def prefill_capture(self, prompt_len: int) -> AttentionCapture | None:
        return self.evictor.prefill_capture(prompt_len)

    def score_key(self) -> Hashable | None:
        """The evictor's: the restore tokens do not change the scores (their LoRA is off while it scores)."""
        return self.evictor.score_key()

    def score(self, ctx: PressContext) -> torch.Tensor:
        self._check_model(ctx.model)
        return self.evictor.score(ctx)

    def budget_scores(self, scores: torch.Tensor, prompt_ids: torch.Tensor, budget: int) -> torch.Tensor:
        return self.evictor.budget_scores(scores, prompt_ids, budget - self.num_tokens)

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return self.evictor.protected(prompt_len)

    @torch.no_grad()
    def appended(self, ctx: PressContext) -> AppendedKV:
        """The restore tokens' K/V from one pass over the full prompt cache (adapter on)."""
        self._check_model(ctx.model)
        return self.adapter.restore(ctx.cache, ctx.prompt_len)

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        """The evictor's budgets for ``C − n`` context entries per KV head (``C`` everywhere when the prompt
        fits: no eviction)."""
        if budget >= prompt_len:
            return [budget] * num_layers
        if budget <= self.num_tokens:
            raise ValueError(
                f"restorekv: a budget of {budget} tokens per KV head leaves no room for the context beside its "
                f"{self.num_tokens} restore tokens; give a budget above {self.num_tokens}"
            )
        return self.evictor.layer_budgets(budget - self.num_tokens, prompt_len, num_layers)

    def _check_model(self, model: PreTrainedModel) -> None:
        if model is not self.adapter.base_model and model is not self.adapter.model:
            raise ValueError("the RestoreKV module was loaded on another model than the one being compressed")
