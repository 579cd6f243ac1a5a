"""Decode-time policies: what looks after the KV cache while tokens are generated.

A prefill method (any :class:`~lkv.eviction.presses.base.Press`) compresses the prompt once. A decode-time policy
then joins every forward pass on the cache (:class:`lkv.core.generation.CacheUpkeep`): eviction policies (H2O,
Scissorhands) re-score the cached entries — generated tokens included — and evict so that the cache never
outgrows its budget; attention-time policies (Quest) leave the cache whole and restrict what each step
attends to.

Budget of an eviction policy: between two steps a layer holds at most ``cap`` entries per KV head. A step's
forward pass appends its own token before attending (its attention includes it), so during that pass the
layer briefly holds ``cap + 1`` — as in H2O's implementation, which attends over ``k + 1`` entries and then
evicts one. A layer found over its cap is cut to ``cap - every + 1`` entries, so evictions come every
``every`` steps and drop ``every`` entries (Scissorhands' "drop amount").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import CAPTURE_KWARG
from lkv.core.budget import Budget, token_budgets
from lkv.core.cache import gather_cache
from lkv.eviction.decoding.capture import AttentionRows
from lkv.eviction.presses.base import Press
from lkv.eviction.selector import Selection, select_indices


@dataclass
class DecodeStart:
    """What a policy may read when decoding starts from a (compressed) prompt.

    Attributes:
        prompt_len: ``S``, the uncompressed prompt length.
        budget: the budget the prompt was compressed to (``None``: unknown).
        layer_budgets: the prefill method's per-layer budgets (PyramidKV spreads them), or ``None``.
        kept: per layer ``(1, kv_heads, C_l)`` prompt positions held by the cache (ascending), or ``None``
            when it holds the whole prompt.
        scores: the prefill method's ``(1, layers, kv_heads, S)`` scores, or ``None``.
        press: the prefill method that produced ``scores`` (a policy may seed its statistics from them).
    """

    prompt_len: int
    budget: Budget | None = None
    layer_budgets: list[int] | None = None
    kept: list[torch.Tensor] | None = None
    scores: torch.Tensor | None = None
    press: Press | None = None

    def positions(self, layer: int, kv_heads: int, device: torch.device) -> torch.Tensor:
        """``(1, kv_heads, n)`` prompt positions of the cache entries of ``layer``."""
        if self.kept is not None:
            return self.kept[layer].to(device)
        return torch.arange(self.prompt_len, device=device).expand(1, kv_heads, self.prompt_len)


class Upkeep(ABC):
    """One generation's policy state (implements :class:`lkv.core.generation.CacheUpkeep`).

    Attributes:
        caps: entries per KV head each layer may hold between steps.
        trace: after each :meth:`enforce`, the most entries per KV head that any layer holds.
    """

    def __init__(self, caps: list[int]) -> None:
        self.caps = caps
        self.trace: list[int] = []

    @abstractmethod
    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        """Extra forward arguments for the next pass on the cache."""

    @abstractmethod
    def observe(self) -> None:
        """Take in what the last forward pass captured."""

    def enforce(self, cache: DynamicCache) -> DynamicCache:
        """Record the cache length; eviction policies also evict here."""
        self.trace.append(max(layer.keys.shape[2] for layer in cache.layers))
        return cache


class CacheTrace(Upkeep):
    """No policy: only records the cache length at every step (what a prefill-only method's cache does)."""

    def __init__(self) -> None:
        super().__init__(caps=[])

    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        return {}

    def observe(self) -> None:
        pass


class DecodePolicy(ABC):
    """A decode-time method; :meth:`begin` makes the state of one generation.

    Args:
        budget: entries per KV head kept while decoding; ``None`` follows the prompt's compression (the
            prefill method's per-layer budgets when it evicted, else the requested budget).
    """

    name: str = "decode-policy"

    def __init__(self, budget: Budget | int | None = None) -> None:
        self.budget = None if budget is None else token_budgets([budget], f"{self.name}: budget")[0]

    def caps(self, start: DecodeStart, num_layers: int) -> list[int]:
        """Entries per KV head each layer may hold while decoding."""
        if self.budget is not None:
            return [self.budget] * num_layers
        if start.kept is not None and start.layer_budgets is not None:
            return list(start.layer_budgets)
        if start.budget is None:
            raise ValueError(
                f"{self.name}: no budget to keep the cache within: give the policy one (budget=...) or decode "
                "a prompt compressed by lkv.eviction.compressor.Compressor"
            )
        return [start.budget.tokens(start.prompt_len)] * num_layers

    def prompt_window(self, budget: int) -> tuple[int, int]:
        """``(sink, recent)`` prompt tokens a prompt eviction must keep to follow this policy's rule."""
        return 0, 0

    @abstractmethod
    def begin(self, model: PreTrainedModel, cache: DynamicCache, start: DecodeStart) -> Upkeep:
        """State for one generation from ``cache`` (which holds the prompt entries ``start`` describes)."""


class EvictionPolicy(DecodePolicy):
    """Evicts by a per-entry statistic kept up to date from each step's attention; recent entries stay.

    Subclasses define the statistic (:meth:`initial_state`, :meth:`update`) and the ranking
    (:meth:`priority`); entries are chosen per layer and KV head by the shared selector (ties keep the
    earlier entry).

    Args:
        budget: see :class:`DecodePolicy`.
        every: evict every ``every`` generated tokens, ``every`` entries at a time (≥ 1).
        recent: the most recent entries always kept: a count, or a fraction of the budget in ``[0, 1)``.
    """

    def __init__(self, budget: int | None = None, every: int = 1, recent: int | float = 0.5) -> None:
        super().__init__(budget)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"{self.name}: every must be a whole number ≥ 1, got {every!r}")
        if isinstance(recent, bool) or not isinstance(recent, (int, float)):
            raise ValueError(
                f"{self.name}: recent must be a count or a fraction of the budget, got {recent!r}"
            )
        if (isinstance(recent, int) and recent < 0) or (isinstance(recent, float) and not 0 <= recent < 1):
            raise ValueError(f"{self.name}: recent must be a count ≥ 0 or a fraction in [0, 1), got {recent}")
        self.every = every
        self.recent = recent

    def recent_window(self, cap: int) -> int:
        """Most recent entries always kept by a layer of ``cap`` entries."""
        return min(self.recent, cap) if isinstance(self.recent, int) else int(self.recent * cap)

    def prompt_window(self, budget: int) -> tuple[int, int]:
        return 0, self.recent_window(budget)

    @abstractmethod
    def initial_state(
        self, start: DecodeStart, layer: int, positions: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Statistics of the prompt entries at ``positions (1, kv_heads, n)``: tensors ``(1, kv_heads, ..., n)``."""

    @abstractmethod
    def update(self, state: dict[str, torch.Tensor], rows: torch.Tensor) -> None:
        """Add one pass's attention ``rows (1, kv_heads, q, K)`` (state already extended to ``K`` entries)."""

    @abstractmethod
    def priority(self, state: dict[str, torch.Tensor], steps: int) -> torch.Tensor:
        """``(1, kv_heads, n)`` ranking of the entries (higher = keep) after ``steps`` observed queries."""

    def begin(self, model: PreTrainedModel, cache: DynamicCache, start: DecodeStart) -> EvictionUpkeep:
        caps = self.caps(start, len(cache.layers))
        for layer, cap in enumerate(caps):
            keep, recent = cap - self.every + 1, self.recent_window(cap)
            if keep < 1 or recent > keep:
                raise ValueError(
                    f"{self.name}, layer {layer}: a budget of {cap} entries evicting every {self.every} steps keeps "
                    f"{keep} entries after an eviction, fewer than its recent window of {recent}; raise the budget "
                    "or lower every/recent"
                )
        states = []
        for layer, cached in enumerate(cache.layers):
            positions = start.positions(layer, cached.keys.shape[1], cached.keys.device)
            if positions.shape[-1] != cached.keys.shape[2]:
                raise ValueError(
                    f"{self.name}: layer {layer} holds {cached.keys.shape[2]} entries, but the prompt it should hold "
                    f"has {positions.shape[-1]}: start the policy on the prompt's own cache"
                )
            states.append(self.initial_state(start, layer, positions))
        return EvictionUpkeep(self, caps, states)


class EvictionUpkeep(Upkeep):
    """State of an :class:`EvictionPolicy` during one generation: per-layer statistics aligned with the cache."""

    def __init__(
        self, policy: EvictionPolicy, caps: list[int], states: list[dict[str, torch.Tensor]]
    ) -> None:
        super().__init__(caps)
        self.policy = policy
        self.states = states
        self.steps = 0  # queries observed (generated tokens, plus an appended question's tokens)
        self._capture: AttentionRows | None = None

    def forward_kwargs(self, generating: bool) -> dict[str, Any]:
        self._capture = AttentionRows()
        return {CAPTURE_KWARG: self._capture}

    def observe(self) -> None:
        capture, self._capture = self._capture, None
        if capture is None:
            raise RuntimeError(
                f"{self.policy.name}: observe() called without a forward pass given forward_kwargs()"
            )
        queries = 0
        for layer, state in enumerate(self.states):
            rows = capture.rows(layer)
            queries = rows.shape[2]
            grown = rows.shape[-1] - _entries(state)
            if grown < 0:
                raise RuntimeError(
                    f"{self.policy.name}, layer {layer}: the cache shrank outside the policy's control "
                    f"({_entries(state)} tracked entries, {rows.shape[-1]} keys)"
                )
            for name, values in state.items():
                state[name] = torch.cat([values, values.new_zeros(*values.shape[:-1], grown)], dim=-1)
            self.policy.update(state, rows)
        self.steps += queries

    def enforce(self, cache: DynamicCache) -> DynamicCache:
        lengths = [layer.keys.shape[2] for layer in cache.layers]
        for layer, (length, state) in enumerate(zip(lengths, self.states, strict=True)):
            if length != _entries(state):
                raise RuntimeError(
                    f"{self.policy.name}, layer {layer}: {length} cached entries but {_entries(state)} tracked: every "
                    "forward pass on the cache must carry the policy's forward_kwargs() and be observed"
                )
        if any(length > cap for length, cap in zip(lengths, self.caps, strict=True)):
            indices = []
            for layer, (length, cap) in enumerate(zip(lengths, self.caps, strict=True)):
                keys = cache.layers[layer].keys
                if length <= cap:
                    indices.append(torch.arange(length, device=keys.device).expand(1, keys.shape[1], length))
                    continue
                state = self.states[layer]
                priority = self.policy.priority(state, self.steps)
                keep = cap - self.policy.every + 1
                window = Selection(recent=self.policy.recent_window(cap))
                kept = select_indices(priority[:, None], [keep], window)[0]
                self.states[layer] = {name: _gather(values, kept) for name, values in state.items()}
                indices.append(kept)
            cache = gather_cache(cache, indices)
        return super().enforce(cache)


def _entries(state: dict[str, torch.Tensor]) -> int:
    return next(iter(state.values())).shape[-1]


def _gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values (1, kv_heads, ..., n)`` at ``index (1, kv_heads, k)`` along the last dimension."""
    middle = values.dim() - 3
    index = index.to(values.device).view(*index.shape[:2], *([1] * middle), index.shape[-1])
    return values.gather(-1, index.expand(*values.shape[:-1], index.shape[-1]))
