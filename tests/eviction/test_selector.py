"""The shared selector and budget rules against naive per-(layer, head) references."""

import math

import pytest
import torch

from lkv.core.budget import Budget, token_budgets
from lkv.eviction.presses.pyramidkv import pyramid_budgets
from lkv.eviction.selector import Selection, select_indices
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
    kept = select_indices(scores, budgets, Selection(sink, recent, kernel, "max"))
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
        select_indices(scores, [3, 3], Selection(sink=1, recent=3))
    with pytest.raises(ValueError, match="2 layers"):
        select_indices(scores, [3])
    with pytest.raises(ValueError, match="NaN"):
        select_indices(torch.full((1, 2, 2, 10), math.nan), [3, 3])
    with pytest.raises(ValueError, match=r"\(1, layers, kv_heads, S\)"):
        select_indices(torch.rand(2, 2, 10), [3, 3])


@pytest.mark.parametrize(("budget", "want"), [(1, 1), (128, 128), (128.0, 128), (0.5, 0.5), (1.0, 1.0)])
def test_valid_budgets(budget, want):
    checked = Budget.of(budget)
    assert checked.value == want and type(checked.value) is type(want)
    assert Budget.of(checked) is checked  # a checked budget passes through as it is
    assert checked.is_ratio == isinstance(want, float)


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
        Budget.of(budget)


def test_ratio_budgets_round_and_keep_one():
    assert Budget(0.25).tokens(100) == 25
    assert Budget(0.001).tokens(100) == 1
    assert Budget(1.0).tokens(37) == 37
    assert Budget(64).tokens(10) == 64


def test_whole_token_budgets_name_their_setting():
    assert token_budgets([64, 128.0], "model.eval_budgets") == (64, 128)
    with pytest.raises(
        ValueError, match=r"^model.eval_budgets: expected a whole number of tokens ≥ 1, got the ratio 0.5"
    ):
        token_budgets([64, 0.5], "model.eval_budgets")
    with pytest.raises(ValueError, match=r"^NeedleReach.budgets: budget must be ≥ 1 token per head, got 0"):
        token_budgets([0], "NeedleReach.budgets")
    with pytest.raises(ValueError, match="give at least one budget"):
        token_budgets([], "ImportanceTask.budgets")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"sink": -1}, "sink and recent must be ≥ 0"),
        ({"kernel": 4}, "odd number"),
        ({"pooling": "median"}, "pooling must be one of"),
        ({"head_budget": "per-head"}, "head_budget must be one of"),
        ({"safeguard": -0.1}, r"safeguard must be in \[0, 1\]"),
    ],
)
def test_selection_settings_are_checked_when_made(settings, match):
    with pytest.raises(ValueError, match=match):
        Selection(**settings)


def test_protecting_keeps_the_wider_window():
    assert Selection(sink=2, recent=1, kernel=3).protecting(1, 4) == Selection(sink=2, recent=4, kernel=3)


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
