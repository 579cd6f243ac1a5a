"""Importance-quality metrics: KL, Recall@C and Kendall τ of predicted vs true scores (torchmetrics).

Every metric takes ``pred`` and ``target`` of shape ``(..., S)`` — one ranking per leading index (a row is
one layer and KV head of one sample) — and averages its per-row values over all rows it was updated with.
Rows are compared as rankings, so ``pred`` may be on any monotone scale (SnapKV's ``+inf`` window included)
except for :class:`ImportanceKL`, which needs distributions.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric, MetricCollection

# Smallest normal float32: a predicted probability that underflowed to 0 costs log(1.2e-38) ≈ -87 nats
# instead of an infinite loss.
_TINY = torch.finfo(torch.float32).tiny


def importance_kl(target: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """KL(target ‖ pred) per row, in nats: ``(..., S), (..., S) → (...)``.

    Zero targets contribute nothing (``xlogy``); both sides must already sum to 1 over ``S``.
    """
    target = target.float()
    return (torch.xlogy(target, target) - torch.xlogy(target, pred.float().clamp_min(_TINY))).sum(-1)


def topc_mass_loss(target: torch.Tensor, pred: torch.Tensor, budget: int) -> torch.Tensor:
    """``−log`` of the predicted mass on the true top-``C`` positions, per row: ``(..., S), (..., S) → (...)``.

    A smooth stand-in for Recall@C that, unlike the KL, weighs the few positions an eviction to ``C`` must keep
    (a needle's value in a retrieval head) as much as the rest of the row together. 0 when ``pred`` puts all its
    mass on the true top-``C``; ``pred`` must sum to 1 over ``S``.
    """
    c = min(budget, pred.shape[-1])
    top = target.float().topk(c, dim=-1).indices
    return -pred.float().gather(-1, top).sum(-1).clamp_min(_TINY).log()


def importance_loss(
    target: torch.Tensor, pred: torch.Tensor, topc_weight: float = 0.0, topc_budget: int = 64
) -> torch.Tensor:
    """The training loss per row: KL(target ‖ pred) (docs/design.md §1), plus ``topc_weight`` times
    :func:`topc_mass_loss` at ``topc_budget`` when it is positive. ``(..., S), (..., S) → (...)``."""
    loss = importance_kl(target, pred)
    if topc_weight > 0:
        loss = loss + topc_weight * topc_mass_loss(target, pred, topc_budget)
    return loss


def topk_recall(pred: torch.Tensor, target: torch.Tensor, budget: int) -> torch.Tensor:
    """``|top-C(pred) ∩ top-C(target)| / C`` per row, ``C = min(budget, S)``: ``(..., S) → (...)``.

    Ties at the C-th place are broken by ``torch.topk`` (arbitrary but deterministic).
    """
    c = min(budget, pred.shape[-1])
    chosen = torch.zeros(pred.shape, dtype=torch.bool, device=pred.device)
    chosen.scatter_(-1, pred.topk(c, dim=-1).indices, True)
    hits = chosen.gather(-1, target.topk(c, dim=-1).indices)
    return hits.float().sum(-1) / c


def _tied_pairs(new_run: torch.Tensor) -> torch.Tensor:
    """Pairs inside runs of equal values: ``new_run (rows, n)`` marks where a run starts in sorted order."""
    run = new_run.long().cumsum(-1) - 1
    sizes = torch.zeros_like(run).scatter_add_(-1, run, torch.ones_like(run))
    return (sizes * (sizes - 1) // 2).sum(-1)


def _run_starts(*sorted_keys: torch.Tensor) -> torch.Tensor:
    """``(rows, n)`` True where any key differs from the previous position (keys sorted jointly)."""
    change = torch.zeros_like(sorted_keys[0][:, 1:], dtype=torch.bool)
    for key in sorted_keys:
        change |= key[:, 1:] != key[:, :-1]
    return torch.cat([torch.ones_like(change[:, :1]), change], dim=-1)


def _strict_inversions(values: torch.Tensor) -> torch.Tensor:
    """Pairs ``i < j`` with ``values[i] > values[j]`` per row of ``(rows, n)``, in O(n log² n).

    Merge-sort counting without the merges: at level ``h`` the row is cut into blocks of ``2h``; every
    right-half element counts the left-half elements above it (sorted left half + ``searchsorted``).
    Each pair is counted once, at the level where the two first fall into different halves.
    """
    rows, n = values.shape
    size = 1 << max(n - 1, 1).bit_length()
    # +inf padding at the end is never above anything to its right.
    padded = torch.cat([values, values.new_full((rows, size - n), float("inf"))], dim=-1)
    count = torch.zeros(rows, dtype=torch.long, device=values.device)
    half = 1
    while half < size:
        blocks = padded.view(rows, size // (2 * half), 2, half)
        left = blocks[:, :, 0].sort(dim=-1).values.contiguous()
        at_most = torch.searchsorted(left, blocks[:, :, 1].contiguous(), right=True)
        count += (half - at_most).sum(dim=(1, 2))
        half *= 2
    return count


def kendall_tau_b(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Exact Kendall τ-b per row over all ``n(n-1)/2`` position pairs: ``(..., n) → (...)``.

    τ_b = (C − D) / sqrt((n₀ − T_pred)(n₀ − T_target)) with C/D the concordant/discordant pairs and T the
    pairs tied on one side (Knight's O(n log n) scheme: sort by (pred, target), count target inversions).
    Comparisons only, so ``+inf`` entries tie with each other. A row where either side is constant has no
    defined τ and gets 0. Fully vectorised over rows: a 16K-position row costs ~14 batched sorts.
    """
    shape, n = pred.shape[:-1], pred.shape[-1]
    x, y = pred.reshape(-1, n), target.reshape(-1, n)
    # lexicographic order by (x, y): stable sort by y, then stable sort by x
    by_y = y.sort(dim=-1, stable=True).indices
    x, y = x.gather(-1, by_y), y.gather(-1, by_y)
    by_x = x.sort(dim=-1, stable=True).indices
    x, y = x.gather(-1, by_x), y.gather(-1, by_x)
    # pairs tied in x are in ascending y, so strict inversions of y are exactly the discordant pairs
    discordant = _strict_inversions(y)
    ties_x = _tied_pairs(_run_starts(x))
    ties_y = _tied_pairs(_run_starts(y.sort(dim=-1).values))
    ties_xy = _tied_pairs(_run_starts(x, y))
    pairs = n * (n - 1) // 2
    concordant = pairs - ties_x - ties_y + ties_xy - discordant
    untied = (pairs - ties_x).double() * (pairs - ties_y).double()
    tau = torch.where(untied > 0, (concordant - discordant).double() / untied.clamp_min(1).sqrt(), 0.0)
    return tau.float().reshape(shape)


class _RowMean(Metric):
    """Mean of a per-row statistic over every row seen; subclasses define :meth:`rows`."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def rows(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add rows ``pred, target: (..., S)``."""
        if pred.shape != target.shape:
            raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
        values = self.rows(pred, target)
        self.total += values.double().sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp_min(1)).float()


class ImportanceKL(_RowMean):
    """Mean KL(target ‖ pred) per row, in nats (see :func:`importance_kl`)."""

    higher_is_better = False

    def rows(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return importance_kl(target, pred)


class RecallAtC(_RowMean):
    """Mean Recall@C per row: overlap of predicted and true top-C sets over C (see :func:`topk_recall`).

    Args:
        budget: C, whole tokens (checked where it enters: :func:`lkv.core.budget.token_budgets`).
    """

    def __init__(self, budget: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.budget = budget

    def rows(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return topk_recall(pred, target, self.budget)


class KendallTau(_RowMean):
    """Mean Kendall τ-b per row between predicted and true scores, exact over every position pair
    (see :func:`kendall_tau_b`; O(S log² S) per row, so 16K-token prompts are affordable)."""

    def rows(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return kendall_tau_b(pred, target)


def ranking_metrics(budgets: list[int], prefix: str, kl: bool = True) -> MetricCollection:
    """``{prefix}kl``, ``{prefix}recall@C`` for each budget and ``{prefix}kendall_tau`` as one collection.

    Args:
        kl: include KL (only meaningful when ``pred`` is a distribution, not for SnapKV's ranking scores).
    """
    metrics: dict[str, Metric] = {f"recall@{c}": RecallAtC(c) for c in budgets}
    metrics["kendall_tau"] = KendallTau()
    if kl:
        metrics["kl"] = ImportanceKL()
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)
