"""The shared selector: scores + budget → which prompt positions each (layer, KV head) keeps.

Every eviction method goes through :func:`select_indices`, so methods differ only in their scores (and, for
PyramidKV, in how the total budget is spread over layers). Ties are broken towards the earlier position,
which makes the selection deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lkv.eviction.presses.base import pool_scores


def check_budget(budget: int | float) -> int | float:
    """Validate a budget: an ``int`` ≥ 1 is tokens per KV head, a ``float`` in ``(0, 1]`` a ratio of ``S``.

    A whole float above 1 (``128.0``, as a command line may give it) counts as tokens.

    Returns:
        the budget as an ``int`` (tokens) or a ``float`` (ratio).
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"budget must be an int (tokens per head) or a float ratio, got {budget!r}")
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"budget must be ≥ 1 token per head, got {budget}")
        return budget
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(
            f"budget must be positive: a ratio in (0, 1] or a whole number of tokens, got {budget}"
        )
    if budget <= 1:
        return budget
    if not budget.is_integer():
        raise ValueError(
            f"budget {budget} is neither a ratio in (0, 1] nor a whole number of tokens per head (e.g. 128)"
        )
    return int(budget)


def budget_tokens(budget: int | float, prompt_len: int) -> int:
    """Tokens kept per KV head for a prompt of ``prompt_len`` (a ratio rounds, keeping at least one)."""
    budget = check_budget(budget)
    if isinstance(budget, float):
        return max(1, round(budget * prompt_len))
    return budget


def select_indices(
    scores: torch.Tensor,
    budgets: Sequence[int],
    sink: int = 0,
    recent: int = 0,
    kernel: int = 1,
    pooling: str = "max",
) -> list[torch.Tensor]:
    """Top-``C_l`` prompt positions per layer and KV head.

    Args:
        scores: ``(1, layers, kv_heads, S)``, higher = keep; ``+inf`` marks positions a method always keeps.
        budgets: ``C_l`` per layer; ``C_l ≥ S`` keeps the whole layer.
        sink, recent: the first ``sink`` and last ``recent`` positions are always kept (they count against
            the budget).
        kernel, pooling: optional 1-D pooling of the finite scores (``POOLING_MODES``, odd kernel; 1 = none).

    Returns:
        one ``(1, kv_heads, C_l)`` int64 tensor per layer, positions in ascending (original) order.
    """
    if scores.ndim != 4 or scores.shape[0] != 1:
        raise ValueError(f"scores must be (1, layers, kv_heads, S), got shape {tuple(scores.shape)}")
    num_layers, prompt_len = scores.shape[1], scores.shape[3]
    if len(budgets) != num_layers:
        raise ValueError(f"got {len(budgets)} layer budgets for {num_layers} layers")
    if sink < 0 or recent < 0:
        raise ValueError(f"sink and recent must be ≥ 0, got sink={sink}, recent={recent}")
    scores = scores.float()
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN")
    always = torch.isposinf(scores)
    if kernel > 1:
        # Pool finite scores only: a method's +inf (always kept) must not spread to its neighbours.
        finite_max = scores.masked_fill(always, float("-inf")).amax(dim=-1, keepdim=True)
        scores = pool_scores(torch.where(always, finite_max, scores), kernel, pooling)
    positions = torch.arange(prompt_len, device=scores.device)
    always = always | (positions < sink) | (positions >= prompt_len - recent)
    ranked = scores.masked_fill(always, float("inf"))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    protected_count = always.sum(dim=-1).amax(dim=-1)  # (1, layers): the most any head of a layer must keep
    kept = []
    for layer, budget in enumerate(budgets):
        if budget <= 0:
            raise ValueError(f"layer {layer}: budget must be ≥ 1, got {budget}")
        if budget >= prompt_len:
            kept.append(positions.expand(1, scores.shape[2], prompt_len))
            continue
        if protected_count[0, layer] > budget:
            raise ValueError(
                f"layer {layer}: budget {budget} is smaller than the {int(protected_count[0, layer])} positions "
                "that must be kept (sink, recent window, the method's own window); raise the budget or shrink them"
            )
        kept.append(order[:, layer, :, :budget].sort(dim=-1).values)
    return kept
