"""FusedPress: the pooled mixture of its parts' normalised scores, with one prefill capture among them."""

import pytest
import torch
import torch.nn.functional as F

from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FusedPress, LookaheadKVPress
from lkv.eviction.presses.sentences import SentencePress
from lkv.eviction.registry import make_method
from tests.eviction.conftest import FUSED, PROMPT_LEN, build_press, prompt, sentence_ends_every


def test_fused_scores_are_the_pooled_weighted_mixture_of_the_parts_distributions(tiny_llama):
    model, tokenizer = tiny_llama
    fused = FusedPress(build_press(FUSED, model).parts, [0.3, 0.7], kernel=5)  # unequal: a swap would show
    ids = prompt(model)
    parts = [Compressor(model, tokenizer, part, 12).score(ids).scores for part in fused.parts]
    # reference: every (layer, head) row by hand, in float64
    want = torch.zeros_like(parts[0], dtype=torch.float64)
    for weight, scores in zip(fused.weights, parts, strict=True):
        for index in torch.cartesian_prod(*[torch.arange(n) for n in scores.shape[:-1]]):
            row = scores[tuple(index)].double()
            want[tuple(index)] += weight * row / row.sum()
    want = F.max_pool1d(want.reshape(-1, 1, PROMPT_LEN), 5, stride=1, padding=2).reshape(want.shape)
    got = Compressor(model, tokenizer, fused, 12).score(ids).scores
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-8)


def test_all_weight_on_one_part_keeps_what_that_part_keeps_alone(tiny_llama):
    model, tokenizer = tiny_llama
    lookahead, probe = build_press(FUSED, model).parts
    ids = prompt(model)
    alone = Compressor(model, tokenizer, LookaheadKVPress(lookahead.adapter, kernel=5), 12).compress(ids).kept
    fused = FusedPress([lookahead, probe], [1.0, 0.0], kernel=5)
    got = Compressor(model, tokenizer, fused, 12).compress(ids).kept
    assert all(torch.equal(a.sort().values, b.sort().values) for a, b in zip(got, alone, strict=True))
    half = Compressor(model, tokenizer, FusedPress([lookahead, probe], [0.5, 0.5], kernel=5), 12)
    assert any(
        not torch.equal(a.sort().values, b.sort().values)
        for a, b in zip(half.compress(ids).kept, alone, strict=True)
    )


def test_fused_presses_are_checked(tiny_llama):
    model, _ = tiny_llama
    snapkv, probe = make_method("snapkv", window=4), build_press("probe", model)
    with pytest.raises(ValueError, match="one weight each"):
        FusedPress([snapkv, probe], [1.0])
    with pytest.raises(ValueError, match="sum to 1"):
        FusedPress([snapkv, probe], [0.7, 0.7])
    with pytest.raises(ValueError, match="odd number"):
        FusedPress([snapkv, probe], [0.5, 0.5], kernel=4)
    sentences = SentencePress(probe, sentence_ends_every(model.config.vocab_size, 5), 0.5)
    with pytest.raises(ValueError, match=r"\['probe'\] rank by the budget .*wrap the fusion instead"):
        FusedPress([snapkv, sentences], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"\['snapkv', 'probe'\] each ask for one"):
        FusedPress([snapkv, probe], [0.5, 0.5]).prefill_capture(PROMPT_LEN)
    # the window SnapKV always keeps stays kept in a fusion, and it streams only if every part does
    fused = FusedPress([snapkv, make_method("streamingllm", sink=2)], [0.5, 0.5])
    assert fused.protected(PROMPT_LEN) == (2, 4)
    assert fused.streamable and not FusedPress([snapkv, make_method("laq")], [0.5, 0.5]).streamable


def _kept_sets(kept: list[torch.Tensor]) -> list[set[int]]:
    """Per (layer, KV head): the kept prompt positions."""
    return [set(row.tolist()) for layer in kept for row in layer.reshape(-1, layer.shape[-1])]


def test_union_keeps_each_parts_top_tokens_in_turn(tiny_llama):
    """Equal weights: the kept set holds the union of both parts' top-k for the largest k that fits in C, and
    lies inside the union of their top-(k+1); weight 0 on a part keeps the other part's own set."""
    model, tokenizer = tiny_llama
    lookahead, probe = build_press(FUSED, model).parts
    ids = prompt(model)
    pooled = LookaheadKVPress(lookahead.adapter, kernel=5)
    rows = [
        Compressor(model, tokenizer, part, 12).score(ids).scores.reshape(-1, PROMPT_LEN)
        for part in (pooled, probe)
    ]
    union = FusedPress([pooled, probe], [0.5, 0.5], rule="union")
    got = _kept_sets(Compressor(model, tokenizer, union, 12).compress(ids).kept)
    for row, kept in enumerate(got):
        tops = [scores[row].argsort(descending=True, stable=True).tolist() for scores in rows]
        k = max(k for k in range(PROMPT_LEN) if len(set(tops[0][:k]) | set(tops[1][:k])) <= 12)
        assert set(tops[0][:k]) | set(tops[1][:k]) <= kept <= set(tops[0][: k + 1]) | set(tops[1][: k + 1])
    alone = _kept_sets(Compressor(model, tokenizer, pooled, 12).compress(ids).kept)
    only_module = FusedPress([pooled, probe], [1.0, 0.0], rule="union")
    assert _kept_sets(Compressor(model, tokenizer, only_module, 12).compress(ids).kept) == alone
    assert got != alone
    with pytest.raises(ValueError, match="rule must be one of mixture, union"):
        FusedPress([pooled, probe], [0.5, 0.5], rule="max")
