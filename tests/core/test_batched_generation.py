"""Stacking single-row caches (compressed prompts) and decoding them with per-row limits, stop rules and
positions (the labeller's exactness tests are in tests/labels/test_batched.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from lkv.core.batched_generation import greedy_batch, stack_caches, stack_layout
from lkv.core.cache import CompressedCache
from lkv.core.generation import decode
from lkv.eviction.compressor import Compressor
from lkv.eviction.registry import make_method


def compressed(model, length: int, budget: int, method: str = "snapkv", seed: int = 0):
    ids = torch.randint(
        0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)
    )
    return Compressor(model, None, make_method(method, window=4), budget=budget).compress(ids)


def test_uniform_caches_stack_left_padded_and_ragged_ones_only_alike(tiny_llama):
    model, _ = tiny_llama
    rows = [compressed(model, 30, 12), compressed(model, 9, 12, seed=1)]  # the second is kept whole (9)
    padded = stack_caches([r.cache for r in rows], [r.next_logits for r in rows], [30, 9])
    assert padded.lengths == [12, 9] and padded.first_positions == [30, 9]
    assert padded.attention_mask().tolist()[1] == [0, 0, 0] + [1] * 9
    for layer, one in zip(padded.cache.layers, rows[1].cache.layers, strict=True):
        assert torch.equal(layer.keys[1, :, 3:], one.keys[0]) and not layer.keys[1, :, :3].any()

    pyramid = [compressed(model, 40, 12, "pyramidkv", seed) for seed in (2, 3)]
    assert stack_layout(pyramid[0].cache) == stack_layout(pyramid[1].cache) != None  # noqa: E711
    stacked = stack_caches([p.cache for p in pyramid], [p.next_logits for p in pyramid], [40, 40])
    assert isinstance(stacked.cache, CompressedCache) and stacked.padding_fraction == 0
    other = compressed(model, 18, 12, "pyramidkv", 4)  # S - window caps the top layer
    assert stack_layout(other.cache) != stack_layout(pyramid[0].cache)
    with pytest.raises(ValueError, match="same layer lengths"):
        stack_caches([pyramid[0].cache, other.cache], [pyramid[0].next_logits, other.next_logits], [40, 18])


def test_rows_keep_their_own_limits_stop_rules_and_positions(make_tiny_model):
    model, _ = make_tiny_model("qwen", tie_word_embeddings=False, initializer_range=0.1)
    rows = [compressed(model, n, 24, seed=n) for n in (30, 5, 50)]  # the second: 5 entries, 19 padding
    limits, rules = [5, 3, 6], [None, None, lambda tokens: len(tokens) == 2]
    expected = []
    for row, limit, rule in zip(rows, limits, rules, strict=True):
        cache = copy.deepcopy(row.cache)  # batch 1, positions from the uncompressed prompt length
        expected.append(decode(model, cache, row.next_logits, row.prompt_len, limit, stop=rule))
    padded = stack_caches(
        [r.cache for r in rows], [r.next_logits for r in rows], [r.prompt_len for r in rows]
    )
    done = {f.row: f for f in greedy_batch(model, padded, limits, stop=rules, keep_prompt=False)}
    assert [done[row].tokens for row in range(3)] == expected
    assert [len(done[row].tokens) for row in range(3)] == [5, 3, 2]
    assert all(f.prompt_cache is None and f.seconds > 0 for f in done.values())
