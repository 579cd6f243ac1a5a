"""LAQ and SpecKV on tiny models, against independent references.

* the pseudo response is the greedy answer of an independent reference: a full-sequence forward without a
  cache (LAQ, no eviction), the same with SnapKV's evicted keys masked per head (LAQ with eviction), a
  separately built shallower model (SpecKV's self-speculative draft);
* the scores equal eager attention rows of the window and the pseudo tokens, each query counting once;
* the prompt cache is bit-identical after scoring, the compressed cache is exactly the prefill's entries at
  the kept positions, decoding from it matches the masked full-cache reference (the draft tokens' K/V never
  reach decoding), and with a budget ≥ the prompt the answer is token-identical to ``model.generate``.
"""

import copy
import math

import pytest
import torch

from lkv.core.generation import Sampling, prefill
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import PressContext
from lkv.eviction.presses.laq import LAQPress, pooled_window_scores
from lkv.eviction.presses.snapkv import snapkv_scores
from lkv.eviction.presses.speckv import SpecKVPress, truncated_draft
from lkv.eviction.selector import select_indices
from tests.reference import eager_reference, evicted_reference_logits, greedy_steps, keep_mask

PROMPT_LEN, WINDOW, TOKENS = 40, 4, 5


def prompt(model, length: int = PROMPT_LEN, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=generator)


def presses() -> dict:
    return {
        "laq": lambda: LAQPress(draft_budget=12, num_tokens=TOKENS, window=WINDOW, kernel=1),
        "speckv": lambda: SpecKVPress(num_tokens=TOKENS, window=WINDOW, kernel=1),
    }


def context(model, press, ids: torch.Tensor, eos: list[int] = ()) -> PressContext:
    capture = press.prefill_capture(ids.shape[1])
    cache, logits = prefill(model, ids, lkv_capture=capture)
    return PressContext(model, ids, cache, logits, capture, list(eos))


def cache_tensors(cache) -> list[torch.Tensor]:
    return [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]


@torch.no_grad()
def reference_greedy(model, ids: torch.Tensor, steps: int, keep: torch.Tensor | None = None) -> list[int]:
    """Greedy tokens by re-running the whole sequence each step (no cache), evicted keys masked if ``keep``."""
    seq = ids
    for _ in range(steps):
        if keep is None:
            logits = model(input_ids=seq).logits[0, -1]
        else:
            logits = evicted_reference_logits(model, seq, keep)[-1]
        seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
    return seq[0, ids.shape[1] :].tolist()


def reference_scores(model, ids: torch.Tensor, tokens: list[int], window: int) -> torch.Tensor:
    """``(1, layers, kv_heads, S)``: eager rows of the window and of the teacher-forced tokens, per query."""
    prompt_len = ids.shape[1]
    full = torch.cat([ids, torch.tensor([tokens])], dim=1)
    window_rows = eager_reference(model, ids, prompt_len, prompt_len - window)
    pseudo_rows = eager_reference(model, full, prompt_len, prompt_len)
    mixed = (window * window_rows + len(tokens) * pseudo_rows) / (window + len(tokens))
    return (mixed / mixed.sum(-1, keepdim=True))[None]


@pytest.mark.parametrize("method", ["laq", "speckv"])
def test_full_budget_is_token_identical_to_generate(tiny_model, method):
    model, tokenizer = tiny_model
    ids = prompt(model)
    want = model.generate(ids, max_new_tokens=8, do_sample=False)[0, PROMPT_LEN:].tolist()
    compressor = Compressor(model, tokenizer, presses()[method](), budget=PROMPT_LEN)
    assert compressor.generate(ids, Sampling(max_new_tokens=8)).token_ids == want
    # Force the scoring (compress() skips it when the budget fits): the cache must come back untouched.
    plain = cache_tensors(prefill(model, ids)[0])
    scored = compressor.score(ids)
    assert scored.scores is not None
    assert all(torch.equal(a, b) for a, b in zip(plain, cache_tensors(scored.cache), strict=True))
    assert (
        compressor.decode(compressor.evict(scored, PROMPT_LEN, in_place=True), Sampling(8)).token_ids == want
    )


@pytest.mark.parametrize("method", ["laq", "speckv"])
def test_scores_are_normalised_with_the_right_shape(tiny_model, method):
    model, _ = tiny_model
    press = presses()[method]()
    press.kernel = 3
    scores = press.score(context(model, press, prompt(model)))
    config = model.config
    assert scores.shape == (1, config.num_hidden_layers, config.num_key_value_heads, PROMPT_LEN)
    assert scores.dtype == torch.float32 and (scores >= 0).all()
    torch.testing.assert_close(scores.sum(-1), torch.ones(scores.shape[:-1]))
    assert press.protected(PROMPT_LEN) == (0, WINDOW) and press.protected(3) == (0, 3)


def test_laq_without_eviction_uses_the_greedy_answer(tiny_model):
    model, _ = tiny_model
    ids = prompt(model)
    press = LAQPress(draft_budget=PROMPT_LEN, num_tokens=TOKENS, window=WINDOW, kernel=1)
    ctx = context(model, press, ids)
    before = cache_tensors(ctx.cache)
    window_attention = ctx.capture.scores(model.config.num_hidden_layers)
    tokens = press.pseudo_response(ctx, window_attention)
    assert tokens == reference_greedy(model, ids, TOKENS)
    assert all(torch.equal(a, b) for a, b in zip(before, cache_tensors(ctx.cache), strict=True))
    scores = press.score(ctx)
    torch.testing.assert_close(scores, reference_scores(model, ids, tokens, WINDOW), atol=1e-5, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(before, cache_tensors(ctx.cache), strict=True))


def test_laq_generates_from_the_snapkv_compressed_cache(tiny_model):
    model, _ = tiny_model
    ids = prompt(model)
    press = LAQPress(draft_budget=10, num_tokens=TOKENS, window=WINDOW, kernel=3)
    ctx = context(model, press, ids)
    before = cache_tensors(ctx.cache)
    window_attention = ctx.capture.scores(model.config.num_hidden_layers)
    snap = snapkv_scores(window_attention, WINDOW, kernel=3)
    keep = keep_mask(select_indices(snap, [10] * model.config.num_hidden_layers), PROMPT_LEN)
    assert not keep.all()
    tokens = press.pseudo_response(ctx, window_attention)
    assert tokens == reference_greedy(model, ids, TOKENS, keep)
    assert all(torch.equal(a, b) for a, b in zip(before, cache_tensors(ctx.cache), strict=True))


def test_laq_stops_at_eos_and_checks_its_budget(tiny_llama):
    model, _ = tiny_llama
    ids = prompt(model)
    first = reference_greedy(model, ids, 1)[0]
    press = LAQPress(draft_budget=PROMPT_LEN, num_tokens=TOKENS, window=WINDOW)
    assert press.pseudo_response(context(model, press, ids, eos=[first]), None) == [first]
    small = LAQPress(draft_budget=3, window=WINDOW)
    with pytest.raises(ValueError, match="smaller than its observation window"):
        small.score(context(model, small, ids))
    with pytest.raises(ValueError, match="num_tokens"):
        LAQPress(num_tokens=0)
    with pytest.raises(ValueError, match="kernel"):
        LAQPress(kernel=2)


def test_self_speculative_draft_matches_a_shallower_model(tiny_model):
    model, _ = tiny_model
    ids = prompt(model)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:1]
    reference = type(model)(config).eval()
    missing, _ = reference.load_state_dict(model.state_dict(), strict=False)
    assert not missing
    draft = truncated_draft(model, 1)
    shared = {id(p) for p in model.parameters()}
    assert all(id(p) in shared for p in draft.parameters())
    assert draft.lm_head is model.lm_head and draft.get_decoder().layers[0] is model.get_decoder().layers[0]
    press = SpecKVPress(draft_layers=1, num_tokens=TOKENS, window=WINDOW, kernel=1)
    ctx = context(model, press, ids)
    tokens = press.pseudo_response(ctx, None)
    assert tokens == reference_greedy(reference, ids, TOKENS)
    scores = press.score(ctx)
    torch.testing.assert_close(scores, reference_scores(model, ids, tokens, WINDOW), atol=1e-5, rtol=0)
    assert model.config.num_hidden_layers > 1  # the target itself is untouched
    assert len(model.get_decoder().layers) == model.config.num_hidden_layers


def test_speckv_with_the_target_as_draft_equals_laq_without_eviction(tiny_model):
    model, _ = tiny_model
    ids = prompt(model)
    laq = LAQPress(draft_budget=PROMPT_LEN, num_tokens=TOKENS, window=WINDOW)
    spec = SpecKVPress(draft=model, num_tokens=TOKENS, window=WINDOW)
    torch.testing.assert_close(
        spec.score(context(model, spec, ids)), laq.score(context(model, laq, ids)), atol=0, rtol=0
    )


def test_speckv_with_a_separate_draft_model(tiny_llama, tiny_qwen):
    model, _ = tiny_llama
    draft, _ = tiny_qwen
    ids = prompt(model)
    press = SpecKVPress(draft=draft, num_tokens=TOKENS, window=WINDOW, kernel=1)
    ctx = context(model, press, ids)
    tokens = press.pseudo_response(ctx, None)
    assert tokens == reference_greedy(draft, ids, TOKENS)
    torch.testing.assert_close(
        press.score(ctx), reference_scores(model, ids, tokens, WINDOW), atol=1e-5, rtol=0
    )


def test_speckv_rejects_bad_drafts(tiny_llama, make_tiny_model):
    model, _ = tiny_llama
    with pytest.raises(ValueError, match="draft_layers must be in 1..3"):
        truncated_draft(model, 4)
    with pytest.raises(ValueError, match="cannot go with a draft model"):
        SpecKVPress(draft=model, draft_layers=1)
    # A draft whose vocabulary is larger than the target's and whose head only ever picks the extra ids.
    wide, _ = make_tiny_model("qwen", vocab_size=4096)
    with torch.no_grad():
        wide.lm_head.weight[: model.config.vocab_size] = 0
    press = SpecKVPress(draft=wide, num_tokens=TOKENS, window=WINDOW)
    with pytest.raises(ValueError, match="share a tokenizer"):
        press.score(context(model, press, prompt(model)))


@pytest.mark.parametrize("method", ["laq", "speckv"])
def test_eviction_keeps_only_prefill_entries_and_decodes_like_the_masked_reference(tiny_model, method):
    model, tokenizer = tiny_model
    ids = prompt(model)
    plain, _ = prefill(model, ids)
    compressed = Compressor(model, tokenizer, presses()[method](), budget=12).compress(ids)
    for layer, plain_layer, kept in zip(compressed.cache.layers, plain.layers, compressed.kept, strict=True):
        index = kept[..., None].expand(-1, -1, -1, plain_layer.keys.shape[-1])
        assert torch.equal(layer.keys, plain_layer.keys.gather(2, index))
        assert torch.equal(layer.values, plain_layer.values.gather(2, index))
        assert (kept[0, :, -WINDOW:] == torch.arange(PROMPT_LEN - WINDOW, PROMPT_LEN)).all()
    tokens, got = greedy_steps(model, compressed.cache, compressed.next_logits, PROMPT_LEN, steps=4)
    want = evicted_reference_logits(
        model, torch.cat([ids[0], tokens])[None], keep_mask(compressed.kept, PROMPT_LEN)
    )
    torch.testing.assert_close(got, want[PROMPT_LEN - 1 :], atol=1e-4, rtol=0)
    assert compressed.kv_bytes_kept * PROMPT_LEN == compressed.kv_bytes_full * 12


def test_pooled_window_scores_matches_a_naive_loop():
    generator = torch.Generator().manual_seed(0)
    attention = torch.softmax(torch.randn(2, 3, 17, generator=generator), dim=-1)
    got = pooled_window_scores(attention, window=4, kernel=5, pooling="max")
    for row, out in zip(attention.reshape(-1, 17).tolist(), got.reshape(-1, 17).tolist(), strict=True):
        prefix = row[:13]
        want = [max(prefix[max(0, j - 2) : j + 3]) for j in range(13)] + row[13:]
        total = sum(want)
        assert all(math.isclose(a, b / total, rel_tol=1e-5) for a, b in zip(out, want, strict=True))
