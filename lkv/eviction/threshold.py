"""Threshold budgets at a matched mean: the one threshold that keeps ``C`` entries per (layer, KV head) on average.

``head_budget="threshold"`` (:mod:`lkv.eviction.selector`, KVzap's DMS) keeps every entry whose normalised
score passes a threshold, so kept counts vary per head, layer and prompt. To set it beside top-``C`` rows at the
same mean KV entries, one threshold per method and suite is calibrated on the suite's prompts:

    target  = Σ_prompts layers · kv_heads · min(C_p, S_p)       C_p: the budget in tokens for prompt p
    τ       = the k-th highest normalised score pooled over every prompt, layer, KV head and position not
              kept anyway (protected windows, each head's best entry, every entry of a prompt with
              C_p ≥ S_p, which is not evicted at all), k = target − the entries kept anyway

so the suite's kept entries, and hence the mean per (prompt, layer, KV head), equal the target's (exactly,
unless scores tie at ``τ``: all tied entries are kept). :func:`kept_stats` reports the mean and the spread a
selection keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lkv.core.budget import Budget
from lkv.eviction.selector import Selection, threshold_scores


@dataclass(frozen=True)
class KeptStats:
    """Kept entries per (layer, KV head) over a suite's prompts (``head_budget="threshold"``).

    Attributes:
        mean: the mean over every (prompt, layer, KV head).
        std: their standard deviation (population).
        low, high: the fewest and most one (prompt, layer, KV head) keeps.
    """

    mean: float
    std: float
    low: int
    high: int


def calibrate_threshold(
    scores: Sequence[torch.Tensor], budget: Budget, selection: Selection | Sequence[Selection]
) -> float:
    """The threshold whose ``threshold`` selection keeps ``budget`` entries per (layer, KV head) on average over
    the prompts scored ``scores`` (the rule in the module docstring).

    Args:
        scores: one ``(1, layers, kv_heads, S_p)`` tensor per prompt (a press's scores, as the selector ranks
            them: :meth:`~lkv.eviction.presses.base.Press.budget_scores`); lengths may differ.
        budget: the target mean ``C`` (tokens per KV head, or a ratio of each prompt).
        selection: the selector's settings (sink, recent window, pooling; its own threshold is ignored), or one
            per prompt (a method's window may depend on the prompt's length).

    Returns:
        the threshold on :func:`~lkv.eviction.selector.normalised_scores`' log scale; when the entries kept
        anyway already reach the target, one above every score (nothing more is kept).
    """
    if not scores:
        raise ValueError("calibrating a threshold needs the scores of at least one prompt")
    selections = [selection] * len(scores) if isinstance(selection, Selection) else list(selection)
    if len(selections) != len(scores):
        raise ValueError(f"got {len(selections)} selections for the scores of {len(scores)} prompts")
    target, anyway, candidates = 0, 0, []
    for prompt_scores, prompt_selection in zip(scores, selections, strict=True):
        normalised = threshold_scores(prompt_scores, prompt_selection)
        prompt_len = normalised.shape[-1]
        rows = normalised.shape[1] * normalised.shape[2]
        target += rows * min(budget.tokens(prompt_len), prompt_len)
        if budget.tokens(prompt_len) >= prompt_len:  # the whole prompt fits: not evicted
            anyway += rows * prompt_len
            continue
        kept = torch.isposinf(normalised)
        anyway += int(kept.sum())
        candidates.append(normalised[~kept & torch.isfinite(normalised)].flatten())
    pooled = torch.cat(candidates)
    wanted = target - anyway
    if wanted <= 0 or pooled.numel() == 0:
        return float(pooled.max()) + 1.0 if pooled.numel() else 0.0
    return float(pooled.topk(min(wanted, pooled.numel())).values[-1])


def kept_stats(kept: Sequence[Sequence[torch.Tensor]]) -> KeptStats:
    """Mean and spread of the entries kept per (layer, KV head) over prompts.

    Args:
        kept: per prompt, the selector's per-layer ``(1, kv_heads, W_l)`` kept positions (``-1``: padding).
    """
    counts = torch.cat([(index >= 0).sum(dim=-1).flatten() for layers in kept for index in layers]).double()
    if counts.numel() == 0:
        raise ValueError("no kept positions to summarise")
    return KeptStats(
        float(counts.mean()), float(counts.std(correction=0)), int(counts.min()), int(counts.max())
    )
