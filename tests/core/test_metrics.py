"""KL, Recall@C and Kendall τ against hand-computed cases and a brute-force τ-b."""

import math
from itertools import combinations

import pytest
import torch

from lkv.core.metrics import (
    ImportanceKL,
    KendallTau,
    RecallAtC,
    importance_kl,
    kendall_tau_b,
    ranking_metrics,
    topk_recall,
)


def brute_tau_b(x: list[float], y: list[float]) -> float:
    """τ-b from its definition, pair by pair."""
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    concordance = untied_x = untied_y = 0
    for i, j in combinations(range(len(x)), 2):
        sx = 0 if x[i] == x[j] else sign(x[i] - x[j])
        sy = 0 if y[i] == y[j] else sign(y[i] - y[j])
        concordance += sx * sy
        untied_x += abs(sx)
        untied_y += abs(sy)
    return concordance / math.sqrt(untied_x * untied_y) if untied_x and untied_y else 0.0


def test_kl_hand_computed():
    target = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    pred = torch.tensor([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]])
    torch.testing.assert_close(importance_kl(target, pred), torch.tensor([math.log(2), 0.0]))
    # a zero target ignores an underflowed prediction; a non-zero one is penalised, finitely
    assert importance_kl(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])).item() == 0.0
    assert math.isfinite(importance_kl(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])).item())


def test_recall_hand_computed():
    pred = torch.tensor([4.0, 3.0, 2.0, 1.0])
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert topk_recall(pred, target, 2).item() == 0.0
    assert topk_recall(pred, target, 3).item() == pytest.approx(2 / 3)
    assert topk_recall(pred, target, 10).item() == 1.0  # C ≥ S keeps everything
    # SnapKV's always-kept window (+inf) counts as chosen
    snap = torch.tensor([[0.1, 0.9, float("inf"), float("inf")]])
    assert topk_recall(snap, torch.tensor([[0.0, 0.5, 0.1, 0.4]]), 3).item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("x", "y", "tau"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
        ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
        ([1, 2, 3], [1, 3, 2], 1 / 3),
        ([1, 1, 2], [1, 2, 3], 2 / math.sqrt(6)),
        ([float("inf"), float("inf"), 1], [3, 2, 1], 2 / math.sqrt(6)),
        ([5, 5, 5], [1, 2, 3], 0.0),  # constant side: τ undefined, reported as 0
    ],
)
def test_kendall_hand_computed(x, y, tau):
    got = kendall_tau_b(torch.tensor([x], dtype=torch.float), torch.tensor([y], dtype=torch.float))
    assert got.item() == pytest.approx(tau, abs=1e-6)


def test_kendall_matches_brute_force_with_ties_and_chunks():
    gen = torch.Generator().manual_seed(0)
    # rounded values force ties on both sides
    pred = torch.randint(0, 6, (5, 2, 17), generator=gen).float()
    target = torch.randint(0, 9, (5, 2, 17), generator=gen).float()
    want = torch.tensor(
        [
            [brute_tau_b(p.tolist(), t.tolist()) for p, t in zip(pp, tt, strict=True)]
            for pp, tt in zip(pred, target, strict=True)
        ]
    )
    torch.testing.assert_close(kendall_tau_b(pred, target), want)


def pairwise_tau_b(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """O(n²) τ-b from the full sign matrices, rows ``(rows, n)``."""
    sx = torch.sign(x[:, :, None] - x[:, None, :])
    sy = torch.sign(y[:, :, None] - y[:, None, :])
    return (sx * sy).sum((1, 2)) / (sx.abs().sum((1, 2)) * sy.abs().sum((1, 2))).sqrt()


@pytest.mark.parametrize("n", [2, 5, 64, 1000])
def test_kendall_matches_pairwise_reference_at_any_length(n):
    gen = torch.Generator().manual_seed(n)
    target = torch.rand(6, n, generator=gen, dtype=torch.float64)
    pred = target + 0.3 * torch.rand(
        6, n, generator=gen, dtype=torch.float64
    )  # correlated, τ well inside (-1, 1)
    pred[:, : n // 3] = pred[:, : n // 3].round(decimals=1)  # ties
    torch.testing.assert_close(
        kendall_tau_b(pred, target).double(), pairwise_tau_b(pred, target), atol=1e-6, rtol=0
    )


def test_metrics_average_rows_over_updates():
    recall, kl = RecallAtC(1), ImportanceKL()
    recall.update(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.9, 0.1], [0.1, 0.9]]))
    recall.update(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.8]]))
    assert recall.compute().item() == pytest.approx(2 / 3)
    kl.update(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]))
    kl.update(torch.tensor([0.25, 0.75]), torch.tensor([0.25, 0.75]))
    assert kl.compute().item() == pytest.approx(math.log(2) / 2)
    with pytest.raises(ValueError, match="shapes differ"):
        kl.update(torch.ones(3), torch.ones(4))


def test_kendall_metric_averages_rows():
    gen = torch.Generator().manual_seed(3)
    pred, target = torch.rand(4, 300, generator=gen), torch.rand(4, 300, generator=gen)
    metric = KendallTau()
    metric.update(pred, target)
    metric.update(pred, pred * 2 + 1)
    torch.testing.assert_close(metric.compute(), (kendall_tau_b(pred, target).sum() + 4) / 8)


def test_ranking_metrics_names():
    names = set(ranking_metrics([32, 64], "val/").keys())
    assert names == {"val/recall@32", "val/recall@64", "val/kendall_tau", "val/kl"}
    assert "val/snapkv_kl" not in ranking_metrics([64], "val/snapkv_", kl=False)


def test_topc_mass_loss_is_minus_log_of_the_mass_on_the_true_top_c():
    from lkv.core.metrics import importance_kl, importance_loss, topc_mass_loss

    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(3, 2, 40, generator=gen) * 3, dim=-1)
    pred = torch.softmax(torch.randn(3, 2, 40, generator=gen), dim=-1)
    want = torch.empty(3, 2)
    for i in range(3):
        for j in range(2):
            top = sorted(range(40), key=lambda k: -float(target[i, j, k]))[:5]
            want[i, j] = -torch.log(sum(pred[i, j, k] for k in top))
    torch.testing.assert_close(topc_mass_loss(target, pred, 5), want)
    # all of the predicted mass on the true top-C: no loss; a budget above S: the whole row
    on_top = torch.zeros_like(pred).scatter_(-1, target.topk(5, dim=-1).indices, 0.2)
    torch.testing.assert_close(topc_mass_loss(target, on_top, 5), torch.zeros(3, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(topc_mass_loss(target, pred, 100), torch.zeros(3, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(importance_loss(target, pred), importance_kl(target, pred))
    torch.testing.assert_close(
        importance_loss(target, pred, 0.5, 5), importance_kl(target, pred) + 0.5 * want
    )
