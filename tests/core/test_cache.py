"""Physical cache compression against an independent reference: a full cache whose evicted keys are masked.

``evicted_reference_logits`` runs the whole sequence (prompt + later tokens) through a copy of the model
whose attention is computed here by hand: causal, and for every query after the prompt the prompt keys a
(layer, KV head) evicted are masked out. A compressed cache decoded with the right positions must give the
same logits, which pins down both the gathered entries and the position ids.
"""

import pytest
import torch
from transformers import DynamicCache

from lkv.core.cache import CompressedCache, cache_bytes, gather_cache
from lkv.core.compat import cache_kwargs
from lkv.core.generation import append_tokens, prefill
from tests.reference import evicted_reference_logits, greedy_steps, keep_mask


def random_kept(num_layers: int, kv_heads: int, prompt_len: int, budgets: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.rand(1, kv_heads, prompt_len, generator=generator).argsort(-1)[..., :budget].sort(-1).values
        for budget in budgets
    ]


def test_gather_keeps_the_selected_entries_in_order(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 20))
    cache, _ = prefill(model, ids)
    full = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    kept = random_kept(len(full), model.config.num_key_value_heads, 20, [7] * len(full))
    compressed = gather_cache(cache, kept)
    assert isinstance(compressed, CompressedCache) and not compressed.is_ragged
    for layer, (keys, values), index in zip(compressed.layers, full, kept, strict=True):
        for head in range(keys.shape[1]):
            torch.testing.assert_close(layer.keys[0, head], keys[0, head, index[0, head]], rtol=0, atol=0)
            torch.testing.assert_close(layer.values[0, head], values[0, head, index[0, head]], rtol=0, atol=0)


def test_gather_into_new_layers_leaves_the_source_whole(tiny_llama):
    # what lkv eval does for every (method, budget): no full copy, the shared cache serves the next budget
    model, _ = tiny_llama
    cache, _ = prefill(model, torch.randint(0, model.config.vocab_size, (1, 20)))
    sources = [(layer.keys, layer.values) for layer in cache.layers]
    kept = random_kept(len(sources), model.config.num_key_value_heads, 20, [5, 7, 9])
    copied = gather_cache(cache, kept, in_place=False)
    for layer, (keys, values) in zip(cache.layers, sources, strict=True):
        assert layer.keys is keys and layer.values is values and keys.shape[2] == 20
    in_place = gather_cache(cache, kept)
    for new, old in zip(copied.layers, in_place.layers, strict=True):
        torch.testing.assert_close(new.keys, old.keys, rtol=0, atol=0)
        torch.testing.assert_close(new.values, old.values, rtol=0, atol=0)


def test_bytes_shrink_to_budget_over_length(tiny_model):
    model, _ = tiny_model
    cache, _ = prefill(model, torch.randint(0, model.config.vocab_size, (1, 40)))
    full = cache_bytes(cache)
    layers, kv_heads = len(cache.layers), model.config.num_key_value_heads
    expected = sum(
        2 * kv_heads * 40 * layer.keys.shape[-1] * layer.keys.element_size() for layer in cache.layers
    )
    assert full == expected
    compressed = gather_cache(cache, random_kept(layers, kv_heads, 40, [10] * layers))
    assert cache_bytes(compressed) * 40 == full * 10


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_uniform_compressed_cache_matches_masked_reference(make_tiny_model, base):
    model, _ = make_tiny_model("llama", attn_implementation=base)
    ids = torch.randint(0, model.config.vocab_size, (1, 30))
    cache, next_logits = prefill(model, ids)
    kept = random_kept(3, 2, 30, [9, 9, 9], seed=1)
    compressed = gather_cache(cache, kept)
    tokens, got = greedy_steps(model, compressed, next_logits, 30, steps=4)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep_mask(kept, 30))
    torch.testing.assert_close(got, want[29:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_ragged_cache_decodes_like_the_masked_reference(make_tiny_model, base):
    """Layers of different lengths (PyramidKV): one query per step must see each layer's own entries."""
    model, _ = make_tiny_model("llama", attn_implementation=base)
    ids = torch.randint(0, model.config.vocab_size, (1, 30))
    cache, next_logits = prefill(model, ids)
    kept = random_kept(3, 2, 30, [14, 9, 4], seed=2)
    compressed = gather_cache(cache, kept)
    assert compressed.is_ragged and compressed.layer_lengths() == [14, 9, 4]
    tokens, got = greedy_steps(model, compressed, next_logits, 30, steps=4)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep_mask(kept, 30))
    torch.testing.assert_close(got, want[29:], atol=1e-4, rtol=0)
    assert compressed.layer_lengths() == [18, 13, 8]


@pytest.mark.parametrize("budgets", [[9, 9, 9], [14, 9, 4]], ids=["uniform", "ragged"])
def test_appended_block_gets_the_causal_mask(make_tiny_model, budgets):
    """Question-agnostic: a multi-token block on a compressed cache, positions continuing from S."""
    model, _ = make_tiny_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 38))
    context, question = ids[:, :30], ids[:, 30:]
    cache, _ = prefill(model, context)
    kept = random_kept(3, 2, 30, budgets, seed=3)
    compressed = gather_cache(cache, kept)
    next_logits = append_tokens(model, compressed, question, position=30)
    tokens, got = greedy_steps(model, compressed, next_logits, 38, steps=3)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep_mask(kept, 30))
    torch.testing.assert_close(got, want[37:], atol=1e-4, rtol=0)


def test_ragged_cache_refuses_a_block_it_cannot_mask(tiny_llama):
    model, _ = tiny_llama
    cache, _ = prefill(model, torch.randint(0, model.config.vocab_size, (1, 20)))
    compressed = gather_cache(cache, random_kept(3, 2, 20, [10, 6, 3]))
    with pytest.raises(ValueError, match="one token at a time"), torch.no_grad():
        model(
            input_ids=torch.zeros(1, 3, dtype=torch.long),
            position_ids=torch.arange(20, 23)[None],
            **cache_kwargs(compressed),
        )


def test_gather_rejects_mismatched_positions(tiny_llama):
    model, _ = tiny_llama
    cache, _ = prefill(model, torch.randint(0, model.config.vocab_size, (1, 12)))
    with pytest.raises(ValueError, match="layers"):
        gather_cache(cache, random_kept(2, 2, 12, [4, 4]))
    with pytest.raises(ValueError, match="one row of positions per KV head"):
        gather_cache(cache, random_kept(3, 3, 12, [4, 4, 4]))
    assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 12
