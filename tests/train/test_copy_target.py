import itertools

import pytest
import torch

from lkv.train.copy_target import MAX_SITES, MIN_TOKENS, copied_positions, copy_boosted
from lkv.train.module import LookaheadKVModule, training_loss

HPARAMS = {"topc_loss_weight": 0.0, "topc_loss_budget": 4}


def reference_copied(prompt: list[int], response: list[int]) -> list[bool]:
    """Brute force: position j is copied iff some window of MIN_TOKENS prompt tokens covering j also occurs in
    the response and occurs at most MAX_SITES times in the prompt."""
    windows = [tuple(prompt[a : a + MIN_TOKENS]) for a in range(len(prompt) - MIN_TOKENS + 1)]
    said = {tuple(response[a : a + MIN_TOKENS]) for a in range(len(response) - MIN_TOKENS + 1)}
    return [
        any(
            w in said and windows.count(w) <= MAX_SITES
            for a, w in enumerate(windows)
            if a <= j < a + MIN_TOKENS
        )
        for j in range(len(prompt))
    ]


def test_a_run_the_response_copies_is_marked_and_nothing_else():
    prompt = list(range(1, 13))
    got = copied_positions(prompt, [99, 4, 5, 6, 7, 98])
    assert got.tolist() == [j in (3, 4, 5, 6) for j in range(12)]
    # a run of two tokens is too short to name one place
    assert not copied_positions(prompt, [99, 4, 5, 98]).any()


def test_a_run_found_at_more_places_than_max_sites_marks_none():
    run = [7, 8, 9]
    twice = [1, *run, 2, *run, 3]
    assert copied_positions(twice, run).sum() == 2 * MIN_TOKENS
    thrice = [*twice, *run]
    assert not copied_positions(thrice, run).any()


def test_copied_positions_equal_a_brute_force_reference():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        # a 4-symbol alphabet repeats runs often, so the site cap is exercised
        prompt = torch.randint(
            0, 4, (int(torch.randint(0, 30, (1,), generator=gen)),), generator=gen
        ).tolist()
        response = torch.randint(
            0, 4, (int(torch.randint(0, 8, (1,), generator=gen)),), generator=gen
        ).tolist()
        assert copied_positions(prompt, response).tolist() == reference_copied(prompt, response)


def test_the_boost_moves_its_share_onto_the_copied_tokens_and_rows_still_sum_to_one():
    target = torch.softmax(torch.randn(2, 3, 10), dim=-1)
    copied = torch.zeros(10, dtype=torch.bool)
    copied[[2, 5]] = True
    got = copy_boosted(target, copied, 0.4)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(got[..., copied].sum(-1), 0.6 * target[..., copied].sum(-1) + 0.4)
    torch.testing.assert_close(got[..., ~copied], 0.6 * target[..., ~copied])
    assert copy_boosted(target, torch.zeros(10, dtype=torch.bool), 0.4) is target
    assert copy_boosted(target, copied, 0.0) is target


@pytest.mark.parametrize("response, differs", [([4, 5, 6, 7], True), ([90, 91, 92], False)])
def test_the_training_loss_is_boosted_only_where_the_response_copies(response, differs):
    sample = {"prompt_ids": torch.arange(1, 11), "response_ids": torch.tensor(response)}
    target, pred = (torch.softmax(torch.randn(2, 3, 10), dim=-1) for _ in range(2))
    plain = training_loss(target, pred, {**HPARAMS, "copy_boost": 0.0}, sample)
    boosted = training_loss(target, pred, {**HPARAMS, "copy_boost": 0.5}, sample)
    assert plain.shape == boosted.shape == (2, 3)
    assert (plain - boosted).abs().max().item() > 1e-3 if differs else torch.equal(plain, boosted)


@pytest.mark.parametrize("boost", [-0.1, 1.0])
def test_a_boost_outside_zero_to_one_is_refused_by_name(boost):
    with pytest.raises(ValueError, match=r"model\.copy_boost.*\[0, 1\)"):
        LookaheadKVModule(model="tiny", copy_boost=boost)


def test_every_combination_of_short_runs_is_checked():
    """All prompts of length 6 and responses of length 3 over two symbols: the reference and the rule agree."""
    for prompt in itertools.product(range(2), repeat=6):
        for response in itertools.product(range(2), repeat=3):
            assert copied_positions(prompt, response).tolist() == reference_copied(
                list(prompt), list(response)
            )
