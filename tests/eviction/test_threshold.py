"""Threshold budgets (KVzap's DMS): the selection against a plain-Python reference, the ragged cache against the
full cache with the evicted keys masked, and the calibrated threshold's mean budget (streamed ≡ two-phase:
tests/eviction/test_head_budget.py)."""

import math

import pytest
import torch

from lkv.core.budget import Budget
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress
from lkv.eviction.selector import Selection, select_indices
from lkv.eviction.threshold import calibrate_threshold, kept_stats
from tests.eviction.conftest import PROMPT_LEN, build_press, prompt
from tests.reference import check_decodes_as_masked, keep_mask

METHODS = ["snapkv", "keydiff", "probe", "lookaheadkv"]


def naive_threshold(row: list[float], threshold: float, sink: int, recent: int) -> list[int]:
    """One head in plain Python: ``log(S · share)`` of the finite scores (mass if none is negative, else
    softmax), kept when ``≥ threshold``, with the +inf, sink and recent positions and the best entry."""
    length = len(row)
    finite = [v for v in row if v != math.inf]
    if any(v < 0 for v in finite):
        top = max(finite)
        total = sum(math.exp(v - top) for v in finite)
        share = [math.exp(v - top) / total if v != math.inf else math.inf for v in row]
    else:
        total = sum(finite)
        share = [
            v / total if v != math.inf and total > 0 else (math.inf if v == math.inf else 0.0) for v in row
        ]
    log_rel = [
        math.log(length * p) if 0 < p < math.inf else (-math.inf if p == 0 else math.inf) for p in share
    ]
    best = max(range(length), key=lambda j: (log_rel[j], -j))
    return [
        j for j in range(length) if log_rel[j] >= threshold or j < sink or j >= length - recent or j == best
    ]


def valid_rows(index: torch.Tensor) -> list[list[int]]:
    return [[p for p in row if p >= 0] for row in index[0].tolist()]


@pytest.mark.parametrize("threshold", [0.0, 0.7, -1.0])
def test_threshold_selection_matches_naive_reference(threshold):
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(1, 3, 4, 40, generator=generator) ** 4  # peaked and flat rows
    scores[:, 0, 1] = torch.randn(40, generator=generator)  # a signed row: read as logits
    scores[:, 1, :, -3:] = float("inf")  # a method's own window
    scores[:, 2, 2] = 0.0  # no mass at all: only the forced positions
    scores[:, 2, 3, 5:] = 0.0
    for sink, recent in [(0, 0), (2, 1)]:
        kept = select_indices(
            scores, [8] * 3, Selection(sink, recent, head_budget="threshold", threshold=threshold)
        )
        for layer, index in enumerate(kept):
            assert index.shape[2] == max(len(row) for row in valid_rows(index))  # the widest head's count
            want = [naive_threshold(row, threshold, sink, recent) for row in scores[0, layer].tolist()]
            assert valid_rows(index) == want, f"layer {layer}, sink {sink}, recent {recent}"
    counts = [len(row) for index in kept for row in valid_rows(index)]
    assert len(set(counts)) > 3  # budgets vary per head and per layer


def test_threshold_normalisation_is_scale_and_length_free():
    """A score scaled by a constant keeps the same positions; a prompt twice as long with each score repeated
    (the same distribution, half the mass per token) keeps each repeated position."""
    scores = torch.rand(1, 2, 2, 30, generator=torch.Generator().manual_seed(1)) ** 3
    selection = Selection(head_budget="threshold", threshold=0.3)
    kept = select_indices(scores, [4, 4], selection)
    assert all(
        torch.equal(a, b) for a, b in zip(kept, select_indices(scores * 7, [4, 4], selection), strict=True)
    )
    doubled = select_indices(scores.repeat_interleave(2, dim=-1), [4, 4], selection)
    for short, long in zip(kept, doubled, strict=True):
        assert valid_rows(long) == [
            sorted(q for p in row for q in (2 * p, 2 * p + 1)) for row in valid_rows(short)
        ]


@pytest.mark.parametrize("method", METHODS)
def test_threshold_eviction_equals_masking(tiny_model, method):
    """Ragged per head and per layer: the compressed cache decodes as the full cache with evicted keys masked."""
    model, tokenizer = tiny_model
    press = build_press(method, model)
    model = press.base_model if isinstance(press, LookaheadKVPress) else model
    ids = prompt(model)
    # no threshold given: matched to the budget on the prompt itself
    compressor = Compressor(model, tokenizer, press, 12, Selection(sink=1, head_budget="threshold"))
    compressed = compressor.compress(ids)
    keep = keep_mask(compressed.kept, PROMPT_LEN)
    counts = keep.sum(dim=-1)
    assert 1 < int(counts.max()) < PROMPT_LEN and len(set(counts.flatten().tolist())) > 1
    # the budget's mean, up to the entries tied at the threshold (the tiny model's heads often score alike)
    assert 12 <= float(counts.float().mean()) <= 13
    widths = [layer.keys.shape[2] for layer in compressed.cache.layers]
    assert widths == counts.amax(dim=-1).tolist()

    check_decodes_as_masked(model, compressor, compressed, ids, keep)


@pytest.mark.parametrize("budget", [Budget(10), Budget(0.3)])
def test_calibrated_threshold_matches_the_mean_budget(tiny_llama, budget):
    """Prompts of different lengths, one threshold: the mean kept entries per (prompt, layer, KV head) is the
    target's within 1 %, while single heads keep very different counts."""
    model, tokenizer = tiny_llama
    compressor = Compressor(model, tokenizer, build_press("snapkv", model), budget)
    suite = [prompt(model, length, seed=length) for length in (30, 48, 64, 90)]
    scores = [compressor.score(ids).scores for ids in suite]
    selection = Selection(sink=1, head_budget="threshold")
    threshold = calibrate_threshold(scores, budget, selection)
    chosen = Selection(sink=1, head_budget="threshold", threshold=threshold)
    kept = [select_indices(s, [1] * s.shape[1], chosen) for s in scores]
    stats = kept_stats(kept)
    target = sum(budget.tokens(s.shape[-1]) for s in scores) / len(scores)
    assert stats.mean == pytest.approx(target, rel=0.01)
    assert stats.low < stats.mean < stats.high and stats.std > 0


def test_a_prompt_the_budget_holds_is_not_evicted(tiny_llama):
    """As in every mode, FullKV and a budget ≥ S keep the whole prompt; calibration counts such a prompt whole."""
    model, tokenizer = tiny_llama
    selection = Selection(head_budget="threshold", threshold=5.0)
    ids = prompt(model)
    assert Compressor(model, tokenizer, "fullkv", 12, selection).compress(ids).kept is None
    assert (
        Compressor(model, tokenizer, build_press("snapkv", model), PROMPT_LEN, selection).compress(ids).kept
        is None
    )
    # a 6-token prompt the budget 8 holds (a threshold would keep 1 of its entries) beside a 40-token one: the
    # short one counts whole, so the long one keeps 14 − 6 = 8
    short = torch.tensor([1.0, 0, 0, 0, 0, 0]).view(1, 1, 1, 6)
    long = torch.rand(1, 1, 1, 40, generator=torch.Generator().manual_seed(0))
    calibrated = Selection(head_budget="threshold")
    threshold = calibrate_threshold([short, long], Budget(8), calibrated)
    chosen = Selection(head_budget="threshold", threshold=threshold)
    assert kept_stats([select_indices(long, [8], chosen)]).mean == 8


def test_compressor_calibrates_one_threshold_per_budget(tiny_llama):
    """``Compressor.calibrate`` over a suite, then each prompt evicted with that threshold (streamed here): the
    suite-mean kept entries is each budget's within 1 %; a prompt's own mean is not pinned to it."""
    model, tokenizer = tiny_llama
    suite = [prompt(model, length, seed=length) for length in (30, 48, 64, 90)]
    selection = Selection(head_budget="threshold")
    budgets = [Budget(8), Budget(16)]
    thresholds = Compressor(model, tokenizer, build_press("snapkv", model), selection=selection).calibrate(
        suite, budgets
    )
    assert thresholds[Budget(8)] > thresholds[Budget(16)]
    for budget in budgets:
        compressor = Compressor(
            model,
            tokenizer,
            build_press("snapkv", model),
            budget,
            selection,
            streamed=True,
            thresholds=thresholds,
        )
        kept = [compressor.compress(ids).kept for ids in suite]
        assert kept_stats(kept).mean == pytest.approx(budget.value, rel=0.01)
        own = [kept_stats([one]).mean for one in kept]
        assert max(own) - min(own) > 1, own  # one threshold for the suite, not one per prompt


def test_threshold_bad_input():
    with pytest.raises(ValueError, match="threshold must be a finite log-score"):
        Selection(head_budget="threshold", threshold=float("nan"))
    with pytest.raises(ValueError, match="needs a threshold here"):
        select_indices(torch.rand(1, 2, 2, 8), [4, 4], Selection(head_budget="threshold"))
    with pytest.raises(ValueError, match="at least one prompt"):
        calibrate_threshold([], Budget(8), Selection(head_budget="threshold"))
