"""Every eviction method end to end on tiny models, against exact references.

* budget ≥ prompt length → the answer is token-identical to ``model.generate`` (greedy);
* with eviction → the selection is the naive top-C of the method's scores, and the logits after the
  compressed prompt equal a full-cache forward with the evicted keys masked per (layer, head) (1e-4);
* the cache bytes shrink to exactly (kept entries) / (full entries);
* each method's scores against an independent definition.
"""

import pytest
import torch

from lkv.core.compat import cache_kwargs
from lkv.core.generation import Sampling, prefill
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import Press, PressContext
from lkv.eviction.presses.lookaheadkv import DEFAULT_KERNEL, LookaheadKVPress
from lkv.eviction.presses.snapkv import snapkv_scores
from lkv.eviction.registry import METHODS, make_method
from lkv.eviction.selector import pool_scores
from tests.eviction.conftest import POOLED, PROMPT_LEN, SETTINGS, build_press, prompt
from tests.reference import (
    eager_attentions,
    eager_reference,
    evicted_reference_logits,
    greedy_steps,
    keep_mask,
    naive_select,
)

BUDGET = 12


# presses that append entries of their own after eviction: their exact reference is in their own test file
APPENDING = {"restorekv"}  # tests/eviction/test_restorekv.py


def test_every_registered_method_is_covered():
    assert set(SETTINGS) | APPENDING == {m for m in METHODS if METHODS[m].acts == "prefill"}


@pytest.mark.parametrize("method", list(SETTINGS))
def test_full_budget_is_token_identical_to_generate(tiny_model, method):
    model, tokenizer = tiny_model
    ids = prompt(model)
    want = model.generate(ids, max_new_tokens=10, do_sample=False)[0, PROMPT_LEN:].tolist()
    out = Compressor(model, tokenizer, build_press(method, model), budget=PROMPT_LEN).generate(
        ids, Sampling(max_new_tokens=10)
    )
    assert out.token_ids == want
    assert out.kv_bytes_kept == out.kv_bytes_full and out.kept_per_layer == [PROMPT_LEN] * len(
        out.kept_per_layer
    )


@pytest.mark.parametrize("budget", [1.0, 10 * PROMPT_LEN], ids=["ratio=1", "tokens>S"])
def test_budget_above_length_evicts_nothing(tiny_llama, budget):
    model, tokenizer = tiny_llama
    ids = prompt(model)
    want = model.generate(ids, max_new_tokens=10, do_sample=False)[0, PROMPT_LEN:].tolist()
    out = Compressor(model, tokenizer, build_press("snapkv", model), budget=budget).generate(
        ids, Sampling(max_new_tokens=10)
    )
    assert out.token_ids == want and out.kv_bytes_kept == out.kv_bytes_full


@pytest.mark.parametrize("method", list(SETTINGS))
def test_eviction_matches_masked_full_cache(tiny_model, method):
    model, tokenizer = tiny_model
    ids = prompt(model)
    press = build_press(method, model)
    compressor = Compressor(model, tokenizer, press, budget=BUDGET)
    compressed = compressor.compress(ids)
    num_layers = model.config.num_hidden_layers
    budgets = press.layer_budgets(BUDGET, PROMPT_LEN, num_layers)
    if method == "fullkv":
        assert compressed.kept is None
        keep = torch.ones(num_layers, model.config.num_key_value_heads, PROMPT_LEN, dtype=torch.bool)
    else:
        assert sum(budgets) == num_layers * BUDGET
        sink, recent = press.protected(PROMPT_LEN)
        for layer, kept in enumerate(compressed.kept):
            for head, row in enumerate(compressed.scores[0, layer].tolist()):
                assert kept[0, head].tolist() == naive_select(row, budgets[layer], sink, recent, kernel=1)
        keep = keep_mask(compressed.kept, PROMPT_LEN)
    assert [layer.get_seq_length() for layer in compressed.cache.layers] == compressed.kept_per_layer
    kept_entries = sum(compressed.kept_per_layer)
    assert compressed.kv_bytes_kept * num_layers * PROMPT_LEN == compressed.kv_bytes_full * kept_entries

    tokens, got = greedy_steps(model, compressed.cache, compressed.next_logits, PROMPT_LEN, steps=4)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep)
    torch.testing.assert_close(got, want[PROMPT_LEN - 1 :], atol=1e-4, rtol=0)
    assert compressor.generate(ids, Sampling(max_new_tokens=4)).token_ids == tokens.tolist()


def test_tova_h2o_snapkv_scores_match_eager_attention(tiny_model):
    model, _ = tiny_model
    ids = prompt(model, 30)

    def scores_of(press: Press) -> torch.Tensor:
        capture = press.prefill_capture(30)
        cache, logits = prefill(model, ids, lkv_capture=capture)
        return press.score(PressContext(model, ids, cache, logits, capture))[0]

    last_query = eager_reference(model, ids, 30, 29)
    torch.testing.assert_close(
        scores_of(make_method("tova", ranking="kv_group")), last_query, atol=1e-5, rtol=0
    )
    # the paper's default: the last query's attention averaged over every query head, one ranking per layer
    all_heads = torch.stack([att[0, :, -1, :30].mean(0) for att in eager_attentions(model, ids)])
    tova = scores_of(make_method("tova"))
    torch.testing.assert_close(tova, all_heads[:, None].expand_as(tova), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        scores_of(make_method("h2o")), eager_reference(model, ids, 30, 0), atol=1e-5, rtol=0
    )
    # kvpress's ObservedAttentionPress: per key, the mean over the query heads of the group and over the
    # causal queries that see it
    observed = torch.stack(
        [
            att[0].sum(1).reshape(model.config.num_key_value_heads, -1, 30).mean(1) / torch.arange(30, 0, -1)
            for att in eager_attentions(model, ids)
        ]
    )
    visible_mean = scores_of(make_method("h2o", accumulate="visible_mean"))
    torch.testing.assert_close(
        visible_mean / visible_mean.sum(-1, keepdim=True),
        observed / observed.sum(-1, keepdim=True),
        atol=1e-5,
        rtol=0,
    )
    window = snapkv_scores(eager_reference(model, ids, 30, 24), window=6, kernel=3)
    torch.testing.assert_close(
        scores_of(make_method("snapkv", window=6, kernel=3)), window, atol=1e-5, rtol=0
    )


def test_streamingllm_keeps_sink_and_most_recent(tiny_llama):
    model, tokenizer = tiny_llama
    compressed = Compressor(model, tokenizer, make_method("streamingllm", sink=3), budget=10).compress(
        prompt(model, 30)
    )
    for kept in compressed.kept:
        assert kept[0].tolist() == [[0, 1, 2, *range(23, 30)]] * 2


def test_random_is_seeded(tiny_llama):
    model, tokenizer = tiny_llama
    ids = prompt(model, 30)

    def kept(seed: int) -> list[list[int]]:
        compressed = Compressor(model, tokenizer, make_method("random", seed=seed), budget=8).compress(ids)
        return [index.tolist() for index in compressed.kept]

    assert kept(3) == kept(3) != kept(4)


def test_oracle_scores_the_full_cache_answer(tiny_model):
    """s_GT of the answer ``model.generate`` gives, from eager attention rows of the response queries."""
    model, tokenizer = tiny_model
    ids = prompt(model, 30)
    answer = model.generate(ids, max_new_tokens=6, do_sample=False)
    compressed = Compressor(model, tokenizer, make_method("oracle", response_tokens=6), budget=8).compress(
        ids
    )
    want = eager_reference(model, answer, num_keys=30, first_query=30)
    torch.testing.assert_close(compressed.scores[0], want, atol=1e-5, rtol=0)


def test_lookahead_tokens_never_reach_decoding(tiny_llama, make_tiny_model, tmp_path):
    model, tokenizer = tiny_llama
    ids = prompt(model, 30)
    press = build_press("lookaheadkv", model)
    compressed = Compressor(model, tokenizer, press, budget=8).compress(ids)
    assert [layer.keys.shape[2] for layer in compressed.cache.layers] == [8] * 3
    cache, _ = prefill(press.adapter.model, ids)
    torch.testing.assert_close(compressed.scores, press.adapter.predict(cache, 30), atol=0, rtol=0)
    assert cache.get_seq_length() == 30

    # An exported folder loaded on a fresh copy of the base model scores the same.
    press.adapter.save(tmp_path / "adapter")
    fresh, _ = make_tiny_model("llama")
    loaded = LookaheadKVPress.from_folder(tmp_path / "adapter", fresh, kernel=1)
    again = Compressor(fresh, tokenizer, loaded, budget=8).compress(ids)
    torch.testing.assert_close(again.scores, compressed.scores, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="another model"):
        Compressor(model, tokenizer, loaded, budget=8).compress(ids)


class _LeakyPress(Press):
    """Appends a token to the cache while scoring and forgets to crop it."""

    name = "leaky"

    def score(self, ctx: PressContext) -> torch.Tensor:
        ctx.model(input_ids=ctx.prompt_ids[:, :1], **cache_kwargs(ctx.cache), use_cache=True)
        config = ctx.model.config
        return torch.rand(1, config.num_hidden_layers, config.num_key_value_heads, ctx.prompt_len)


def test_a_press_that_leaves_its_tokens_in_the_cache_is_refused(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(RuntimeError, match="must crop"):
        Compressor(model, tokenizer, _LeakyPress(), budget=8).compress(prompt(model, 20))


def test_snapkv_on_a_prompt_no_longer_than_its_window():
    scores = torch.rand(1, 2, 3, 20)
    assert torch.isinf(snapkv_scores(scores, window=32)).all()
    assert torch.isinf(snapkv_scores(scores, window=20)).all()


def test_tova_ranking_is_checked():
    with pytest.raises(ValueError, match="'layer' or 'kv_group'"):
        make_method("tova", ranking="head")


def test_h2o_accumulation_is_checked():
    with pytest.raises(ValueError, match="'sum' or 'visible_mean'"):
        make_method("h2o", accumulate="max")


def test_snapkv_pooling_modes_differ_only_at_the_prefix_edges():
    """``avg`` divides by the real values under the kernel, ``avg_zero_pad`` by the kernel (kvpress's pooling)."""
    attention = torch.rand(1, 2, 3, 40) + 0.1
    real = snapkv_scores(attention, window=8, kernel=5, pooling="avg")
    padded = snapkv_scores(attention, window=8, kernel=5, pooling="avg_zero_pad")
    prefix = attention[..., :32]
    # Position 0 sees 3 real values (0, 1, 2); the last prefix position 31 sees 29, 30, 31.
    torch.testing.assert_close(real[..., 0], prefix[..., :3].mean(-1))
    torch.testing.assert_close(padded[..., 0], prefix[..., :3].sum(-1) / 5)
    torch.testing.assert_close(padded[..., 31], prefix[..., 29:].sum(-1) / 5)
    torch.testing.assert_close(real[..., 2:30], padded[..., 2:30])
    assert torch.isinf(padded[..., 32:]).all()


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv"])
def test_pooling_mode_is_checked_when_the_press_is_made(method):
    with pytest.raises(ValueError, match="max, avg, avg_zero_pad; got 'median'"):
        make_method(method, pooling="median")
    with pytest.raises(ValueError, match="odd number"):
        make_method(method, kernel=4)


def test_pooled_lookaheadkv_scores_are_its_scores_max_pooled(tiny_llama):
    model, _ = tiny_llama
    pooled = build_press(POOLED, model)
    ids = prompt(pooled.base_model)
    cache, logits = prefill(pooled.base_model, ids)
    ctx = PressContext(pooled.base_model, ids, cache, logits)
    plain = LookaheadKVPress(pooled.adapter, kernel=1).score(ctx)
    assert LookaheadKVPress(pooled.adapter).kernel == DEFAULT_KERNEL == 7  # pooled unless told otherwise
    torch.testing.assert_close(pooled.score(ctx), pool_scores(plain, 5, "max"), rtol=0, atol=0)
    assert not torch.equal(pooled.score(ctx), plain)
    with pytest.raises(ValueError, match="odd number"):
        LookaheadKVPress(pooled.adapter, kernel=4)
