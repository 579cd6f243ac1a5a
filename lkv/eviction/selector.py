"""The shared selector: scores + budget → which prompt positions each (layer, KV head) keeps.

Every eviction method goes through :func:`select_indices`, so methods differ only in their scores (and, for
PyramidKV, in how the total budget is spread over layers). Ties are broken towards the earlier position,
which makes the selection deterministic. The 1-D score pooling (:func:`pool_scores`) lives here too: the
selector applies it to any method's scores, and SnapKV, LAQ and LookaheadKV pool their own with it; so do
the rank rules that merge several rankings into one (:func:`union`).

How a layer's budget is spread over its KV heads (``head_budget``):

- ``equal`` (the paper's, default): every head keeps its top ``C``;
- ``adaptive`` (AdaKV; Feng et al., 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
  Allocation for Efficient LLM Inference"): the layer keeps the same total ``C · kv_heads``, chosen as the top
  of the layer's scores flattened over its heads, so a head whose attention is spread thin gets more entries
  than one that attends to a few tokens. Each head is guaranteed its own top ``⌊safeguard · C⌋`` (at least one;
  the paper's and kvpress's ``alpha_safeguard``, 0.20) and its protected positions. Scores are compared
  across the heads of a layer as they are, as AdaKV and kvpress's ``AdaKVPress`` do: the attention-based
  presses give each head a distribution over the prompt (the capture normalises each head's attention), so
  they compare as they stand; for other presses the scale is the method's own (KeyDiff: cosine distances).
- ``threshold`` (KVzap's and kvpress's ``DMSPress``: keep what scores above a threshold): every (layer, KV
  head, position) whose normalised score (:func:`normalised_scores`) is at least ``threshold`` is kept, with
  the protected positions and each head's top entry (a head with no entry has nothing to attend to), so the
  kept counts vary per head, per layer and per prompt; the budget ``C`` plays no part in the selection. A
  threshold matching a mean budget ``C`` over a suite's prompts is calibrated by
  :func:`lkv.eviction.threshold.calibrate_threshold`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from lkv.eviction.names import HeadBudget

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


def descending_rank(scores: torch.Tensor) -> torch.Tensor:
    """``(..., S)`` scores → float ranks of the same shape: 0 for each row's highest, ``S − 1`` for its lowest
    (ties in position order)."""
    return (-scores).argsort(dim=-1, stable=True).argsort(dim=-1).float()


def union(scores: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Rankings of the same positions ``(..., S)`` each → ``max_i(−rank_i / w_i)``, same shape: its top ``C`` is
    the union of each ranking's top tokens, ranking ``i`` contributing in proportion to ``w_i`` (the ``union``
    rule of :mod:`lkv.eviction.presses.fused`). A ranking of weight 0 contributes nothing (−inf everywhere,
    never above another's −rank/w)."""
    return torch.stack(
        [
            -descending_rank(s) / w if w else torch.full_like(s, -torch.inf, dtype=torch.float32)
            for w, s in zip(weights, scores, strict=True)
        ]
    ).amax(dim=0)


HEAD_BUDGETS: tuple[str, ...] = ("equal", "adaptive", "threshold")
SAFEGUARD = 0.2
"""AdaKV's ``alpha_safeguard``: the share of ``C`` every head keeps whatever the other heads' scores."""


def check_head_budget(head_budget: str, safeguard: float, threshold: float | None = None) -> None:
    """Raise a clear error unless ``head_budget`` is one of :data:`HEAD_BUDGETS`, ``0 ≤ safeguard ≤ 1`` and
    ``threshold`` is ``None`` or a finite number."""
    if head_budget not in HEAD_BUDGETS:
        raise ValueError(f"head_budget must be one of {', '.join(HEAD_BUDGETS)}; got {head_budget!r}")
    if not 0 <= safeguard <= 1:
        raise ValueError(f"safeguard must be in [0, 1] (a share of the per-head budget), got {safeguard}")
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite log-score (0: the uniform share), got {threshold}")


def normalised_scores(scores: torch.Tensor) -> torch.Tensor:
    """Scores made comparable across heads, layers and prompt lengths: ``log(S · p)``, same shape ``(..., S)``.

    ``p`` is each row's share of its finite scores (``+inf``, a method's always-kept positions, are left out
    and stay ``+inf``): non-negative scores are read as mass, ``p = s / Σ s`` (the attention-based presses,
    LookaheadKV and the probe give a distribution already, so ``p = s``); a row with a negative score is read
    as logits, ``p = softmax(s)`` (KeyDiff). ``S · p`` is the mass relative to a uniform share, so ``0`` on
    this log scale means "as much as the average token" whatever ``S``; for the probe ``log(S · p)`` is its
    logit less the row's log-mean-exp, the log-score KVzap thresholds. Zero mass gives ``−inf``.
    """
    always = torch.isposinf(scores)
    finite = scores.masked_fill(always, 0.0)
    signed = (finite < 0).any(dim=-1, keepdim=True)
    log_mass = torch.where(
        signed,
        torch.log_softmax(scores.masked_fill(always, float("-inf")), dim=-1),
        finite.log() - finite.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(finite.dtype).tiny).log(),
    )
    return (log_mass + math.log(scores.shape[-1])).masked_fill(always, float("inf"))


def safeguarded(budget: int, safeguard: float) -> int:
    """Entries every head keeps under ``adaptive`` head budgets: ``⌊safeguard · C⌋``, at least one if ``safeguard > 0``."""
    return min(budget, max(1, int(budget * safeguard))) if safeguard > 0 else 0


def adaptive_width(budget: int, kv_heads: int, prompt_len: int, safeguard: float = SAFEGUARD) -> int:
    """The most entries one head can keep under ``adaptive`` head budgets: the layer's ``C · kv_heads`` less the
    other heads' guaranteed share (a layer width that fits every selection, known before any score)."""
    return min(prompt_len, budget * kv_heads - (kv_heads - 1) * safeguarded(budget, safeguard))


@dataclass(frozen=True)
class Selection:
    """How the selector turns scores into kept positions, beside the budget: one value, checked when made.

    Attributes:
        sink, recent: the first ``sink`` and last ``recent`` prompt positions are always kept (they count
            against the budget).
        kernel, pooling: optional 1-D pooling of the finite scores (:data:`POOLING_MODES`, odd kernel; 1 = none).
        head_budget: ``equal`` (every KV head keeps ``C``, the paper's), ``adaptive`` (AdaKV) or ``threshold``
            (KVzap's DMS; see the module docstring).
        safeguard: under ``adaptive``, the share of ``C`` every head keeps (AdaKV's ``alpha_safeguard``).
        threshold: under ``threshold``, the least normalised score kept (:func:`normalised_scores`, log scale);
            ``None``: matched to the budget on each prompt itself (the prompt keeps ``C`` entries per layer and
            KV head on average: :class:`~lkv.eviction.compressor.Compressor` calibrates it before selecting).
    """

    sink: int = 0
    recent: int = 0
    kernel: int = 1
    pooling: str = "max"
    head_budget: HeadBudget = "equal"
    safeguard: float = SAFEGUARD
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.sink < 0 or self.recent < 0:
            raise ValueError(f"sink and recent must be ≥ 0, got sink={self.sink}, recent={self.recent}")
        check_pooling(self.kernel, self.pooling)
        check_head_budget(self.head_budget, self.safeguard, self.threshold)

    def protecting(self, sink: int, recent: int) -> Selection:
        """These settings, keeping at least ``sink`` leading and ``recent`` trailing positions (a method's own)."""
        return replace(self, sink=max(self.sink, sink), recent=max(self.recent, recent))


DEFAULT_SELECTION = Selection()
"""No sink or recent window of the user's, no pooling, equal head budgets."""


def select_indices(
    scores: torch.Tensor,
    budgets: Sequence[int],
    selection: Selection = DEFAULT_SELECTION,
    width: int | None = None,
) -> list[torch.Tensor]:
    """Top-``C_l`` prompt positions per layer and KV head (``adaptive``: ``C_l · kv_heads`` per layer;
    ``threshold``: every position whose normalised score passes the threshold, whatever ``C_l``).

    Args:
        scores: ``(1, layers, kv_heads, S)``, higher = keep; ``+inf`` marks positions a method always keeps.
        budgets: ``C_l`` per layer (derived from a :class:`~lkv.core.budget.Budget`); ``C_l ≥ S`` keeps the
            whole layer. Not read under ``threshold`` (one per layer is still checked).
        selection: sink, recent window, pooling and how a layer's budget is spread over its heads.
        width: under ``adaptive`` or ``threshold``, pad every layer's rows to this many slots (at least
            :func:`adaptive_width` under ``adaptive``) instead of to its widest head's count.

    Returns:
        one ``(1, kv_heads, C_l)`` int64 tensor per layer, positions in ascending (original) order. Under
        ``adaptive`` and ``threshold`` a layer's rows are as long as its widest head's count (or ``width``); a
        shorter head's row ends in ``-1`` padding (gathered as masked slots: :func:`lkv.core.cache.gather_layer`).
        Layers may then differ in width: the compressed cache holds each layer at its own length
        (:class:`lkv.core.cache.CompressedCache`).
    """
    if scores.ndim != 4 or scores.shape[0] != 1:
        raise ValueError(f"scores must be (1, layers, kv_heads, S), got shape {tuple(scores.shape)}")
    num_layers, prompt_len = scores.shape[1], scores.shape[3]
    if len(budgets) != num_layers:
        raise ValueError(f"got {len(budgets)} layer budgets for {num_layers} layers")
    if selection.head_budget == "threshold":
        if selection.threshold is None:
            raise ValueError(
                "head_budget='threshold' needs a threshold here; calibrate one for the budget first "
                "(lkv.eviction.threshold.calibrate_threshold)"
            )
        keep = threshold_scores(scores, selection) >= selection.threshold
        return [padded_rows(keep[:, layer], width) for layer in range(num_layers)]
    scores, own = _pooled(scores, selection)
    positions = torch.arange(prompt_len, device=scores.device)
    always = own | _window(prompt_len, selection, scores.device)
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
        if selection.head_budget == "equal":
            kept.append(order[:, layer, :, :budget].sort(dim=-1).values)
        else:
            kept.append(_adaptive(ranked[:, layer], order[:, layer], budget, selection.safeguard, width))
    return kept


def threshold_scores(scores: torch.Tensor, selection: Selection) -> torch.Tensor:
    """What ``threshold`` selection compares with ``selection.threshold``: ``scores (..., S)`` pooled as the
    selector pools, then :func:`normalised_scores`, same shape; ``+inf`` on the positions kept whatever the
    threshold (the method's own, ``selection``'s sink and recent window, and each row's best entry, the
    earliest on a tie)."""
    pooled, own = _pooled(scores, selection)
    normalised = normalised_scores(pooled.masked_fill(own, float("inf")))
    best = normalised.argmax(dim=-1, keepdim=True)  # the first of the row's highest
    always = _window(scores.shape[-1], selection, scores.device).expand_as(normalised).clone()
    always.scatter_(-1, best, True)
    return normalised.masked_fill(always, float("inf"))


def _pooled(scores: torch.Tensor, selection: Selection) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores (..., S)`` as float32, pooled (:attr:`Selection.kernel`) over their finite values, and where
    they were ``+inf`` (a method's always-kept positions), same shape."""
    scores = scores.float()
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN")
    own = torch.isposinf(scores)
    if selection.kernel > 1:
        # Pool finite scores only: a method's +inf (always kept) must not spread to its neighbours.
        finite_max = scores.masked_fill(own, float("-inf")).amax(dim=-1, keepdim=True)
        scores = pool_scores(torch.where(own, finite_max, scores), selection.kernel, selection.pooling)
    return scores, own


def _window(prompt_len: int, selection: Selection, device: torch.device) -> torch.Tensor:
    """``(S,)`` bool: the first ``sink`` and last ``recent`` positions of :class:`Selection`."""
    positions = torch.arange(prompt_len, device=device)
    return (positions < selection.sink) | (positions >= prompt_len - selection.recent)


def _adaptive(
    ranked: torch.Tensor, order: torch.Tensor, budget: int, safeguard: float, width: int | None
) -> torch.Tensor:
    """One layer's AdaKV selection.

    Args:
        ranked: ``(1, kv_heads, S)`` scores, ``+inf`` on the positions that must be kept.
        order: ``(1, kv_heads, S)`` each head's positions by decreasing score (ties: earlier first).

    Returns:
        ``(1, kv_heads, W)`` kept positions, ascending, each row padded with ``-1`` after its head's count.
    """
    heads, prompt_len = ranked.shape[1], ranked.shape[2]
    guaranteed = torch.zeros_like(ranked, dtype=torch.bool)
    guaranteed.scatter_(-1, order[..., : safeguarded(budget, safeguard)], True)
    # the top of the flattened layer; ties: the earlier head, then the earlier position (stable sort)
    flat = ranked.masked_fill(guaranteed, float("inf")).reshape(1, heads * prompt_len)
    chosen = torch.sort(flat, dim=-1, descending=True, stable=True).indices[:, : budget * heads]
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(-1, chosen, True).reshape(ranked.shape)
    return padded_rows(keep, width)


def padded_rows(keep: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """One layer's kept positions from its keep mask ``(1, kv_heads, S)`` bool → ``(1, kv_heads, W)`` int64,
    ascending, each head's row padded with ``-1`` after its count; ``W`` is the widest head's count, or
    ``width`` (which must fit it)."""
    prompt_len = keep.shape[-1]
    widest = int(keep.sum(dim=-1).max())
    if width is not None and width < widest:
        raise ValueError(f"width {width} is below the widest head's {widest} kept entries")
    positions = torch.arange(prompt_len, device=keep.device).expand_as(keep)
    rows = torch.where(keep, positions, prompt_len).sort(dim=-1).values[..., : width or widest]
    return rows.masked_fill(rows == prompt_len, -1)
