"""The shared selector and budget rules against naive per-(layer, head) references."""

import math

import pytest
import torch

from lkv.eviction.presses.pyramidkv import pyramid_budgets
from lkv.eviction.selector import budget_tokens, check_budget, select_indices
from tests.reference import naive_select


@pytest.mark.parametrize(
    ("sink", "recent", "kernel"),
    [(0, 0, 1), (2, 3, 1), (0, 4, 5), (1, 0, 3)],
    ids=["plain", "sink+recent", "pool5", "pool3"],
)
def test_selection_matches_naive_reference(sink, recent, kernel):
    generator = torch.Generator().manual_seed(0)
    # Small integers force many ties; a few +inf entries play a method's own always-kept window.
    scores = torch.randint(0, 5, (1, 3, 2, 25), generator=generator).float()
    scores[0, 1, 0, 20:] = math.inf
    budgets = [8, 12, 25]
    kept = select_indices(scores, budgets, sink=sink, recent=recent, kernel=kernel, pooling="max")
    for layer, budget in enumerate(budgets):
        assert kept[layer].shape == (1, 2, min(budget, 25))
        for head in range(2):
            want = naive_select(scores[0, layer, head].tolist(), budget, sink, recent, kernel)
            assert kept[layer][0, head].tolist() == want


def test_budget_at_or_above_length_keeps_everything():
    scores = torch.rand(1, 2, 3, 10)
    for kept in select_indices(scores, [10, 50]):
        assert kept[0].tolist() == [list(range(10))] * 3


def test_selection_errors():
    scores = torch.rand(1, 2, 2, 10)
    with pytest.raises(ValueError, match="smaller than the 4 positions"):
        select_indices(scores, [3, 3], sink=1, recent=3)
    with pytest.raises(ValueError, match="2 layers"):
        select_indices(scores, [3])
    with pytest.raises(ValueError, match="NaN"):
        select_indices(torch.full((1, 2, 2, 10), math.nan), [3, 3])
    with pytest.raises(ValueError, match=r"\(1, layers, kv_heads, S\)"):
        select_indices(torch.rand(2, 2, 10), [3, 3])


@pytest.mark.parametrize(("budget", "want"), [(1, 1), (128, 128), (128.0, 128), (0.5, 0.5), (1.0, 1.0)])
def test_valid_budgets(budget, want):
    assert check_budget(budget) == want and type(check_budget(budget)) is type(want)


@pytest.mark.parametrize(
    ("budget", "error", "match"),
    [
        (0, ValueError, "≥ 1"),
        (-5, ValueError, "≥ 1"),
        (0.0, ValueError, "positive"),
        (-0.5, ValueError, "positive"),
        (12.5, ValueError, "neither a ratio"),
        (1.5, ValueError, "neither a ratio"),
        (math.nan, ValueError, "positive"),
        (True, TypeError, "int"),
        ("128", TypeError, "int"),
    ],
)
def test_invalid_budgets(budget, error, match):
    with pytest.raises(error, match=match):
        check_budget(budget)


def test_ratio_budgets_round_and_keep_one():
    assert budget_tokens(0.25, 100) == 25
    assert budget_tokens(0.001, 100) == 1
    assert budget_tokens(1.0, 37) == 37
    assert budget_tokens(64, 10) == 64


@pytest.mark.parametrize(
    ("budget", "prompt_len", "layers"), [(64, 1000, 30), (100, 130, 7), (40, 2000, 5), (33, 64, 4)]
)
def test_pyramid_keeps_the_total_and_shrinks_with_depth(budget, prompt_len, layers):
    got = pyramid_budgets(budget, prompt_len, layers, window=32)
    assert sum(got) == layers * budget
    assert all(a >= b for a, b in zip(got, got[1:], strict=False))
    assert all(32 <= b <= prompt_len for b in got)


def test_pyramid_matches_the_reference_schedule():
    # Reference implementation (PyramidKV, beta=20): min = (C - w) // beta, max = 2 (C - w) - min, linear steps.
    budget, window, layers = 160, 32, 5
    low = (budget - window) // 20
    high = 2 * (budget - window) - low
    assert pyramid_budgets(budget, 4096, layers, window) == [
        window + high - i * (high - low) // 4 for i in range(5)
    ]


def test_pyramid_edge_cases():
    assert pyramid_budgets(300, 200, 4, window=32) == [200] * 4
    assert pyramid_budgets(32, 200, 4, window=32) == [32] * 4
    with pytest.raises(ValueError, match="observation window"):
        pyramid_budgets(16, 200, 4, window=32)
