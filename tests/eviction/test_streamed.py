"""Layer-streamed eviction equals the two-phase path: scores, kept positions, K/V, generated tokens."""

import pytest
import torch

from lkv.core.compat import CACHE_KWARG
from lkv.core.generation import Sampling
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress, ProbePress
from lkv.eviction.registry import make_method
from lkv.eviction.selector import Selection
from lkv.eviction.streamed import streamed_compress
from tests.conftest import FAMILIES, build_tiny_model, tiny_needle_task
from tests.eviction.conftest import FUSED, PROMPT_LEN, SCALED, SENTENCES, SETTINGS, build_press, prompt

STREAMED = [
    "snapkv",
    "pyramidkv",
    "tova",
    "h2o",
    "streamingllm",
    "random",
    "lookaheadkv",
    "expected_attention",
    "keydiff",
    "probe",
    "lookaheadkv-pooled",
    FUSED,
    SENTENCES,
    SCALED,
]
TRAINED = (
    "lookaheadkv",
    "probe",
    "lookaheadkv-pooled",
    FUSED,
    SENTENCES,
    SCALED,
)  # built from a module, not by name
# tokens per KV head (PyramidKV spreads them over layers), a ratio, and one that keeps all but one token
BUDGETS = [12, 0.5, PROMPT_LEN - 1]


def test_exactly_the_per_layer_local_methods_stream():
    built = {name: make_method(name, **SETTINGS[name]) for name in SETTINGS if name not in TRAINED}
    streamable = {name for name, press in built.items() if press.streamable}
    assert streamable == set(STREAMED) - set(TRAINED)
    assert LookaheadKVPress.streamable and ProbePress.streamable


@pytest.fixture(params=[(f, a) for f in FAMILIES for a in ("sdpa", "eager")], ids=lambda p: "-".join(p))
def model_and_tokenizer(request):
    return build_tiny_model(request.param[0], attn_implementation=request.param[1])


def model_for(press, model):
    return press.base_model if isinstance(press, LookaheadKVPress) else model


@pytest.mark.parametrize("method", STREAMED)
def test_streamed_scores_and_cache_equal_two_phase(model_and_tokenizer, method):
    model, tokenizer = model_and_tokenizer
    press = build_press(method, model)
    model = model_for(press, model)
    ids = prompt(model)
    for budget in BUDGETS:
        two_phase = Compressor(model, tokenizer, press, budget)
        scored = two_phase.score(ids)
        want = two_phase.evict(scored, in_place=False)
        got = Compressor(model, tokenizer, press, budget, streamed=True).compress(ids)
        budgets = two_phase.layer_budgets(budget, PROMPT_LEN)
        sink, recent = press.protected(PROMPT_LEN)
        scores = streamed_compress(
            model, press, ids, budgets, Selection(sink, recent), keep_scores=True
        ).scores
        torch.testing.assert_close(scores, scored.scores, rtol=0, atol=1e-5, msg=f"budget {budget}")
        assert got.layer_budgets == want.layer_budgets
        for layer, (kept, wanted) in enumerate(zip(got.kept, want.kept, strict=True)):
            assert torch.equal(kept, wanted), f"budget {budget}, layer {layer}: other positions kept"
        for layer, (a, b) in enumerate(zip(got.cache.layers, want.cache.layers, strict=True)):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {layer} K/V"
        assert got.kv_bytes_full == want.kv_bytes_full and got.kv_bytes_kept == want.kv_bytes_kept
        torch.testing.assert_close(got.next_logits, want.next_logits, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv", "lookaheadkv", "probe", FUSED, SENTENCES])
def test_streamed_generation_is_token_identical(tiny_model, method):
    model, tokenizer = tiny_model
    press = build_press(method, model)
    model = model_for(press, model)
    ids, sampling = prompt(model), Sampling(max_new_tokens=12)
    for question in (None, [5, 6, 7]):  # question-aware, then question-agnostic (a block appended)
        want = Compressor(model, tokenizer, press, 12, Selection(recent=2)).generate(ids, sampling, question)
        got = Compressor(model, tokenizer, press, 12, Selection(recent=2), streamed=True).generate(
            ids, sampling, question
        )
        assert got.token_ids == want.token_ids and got.kept_per_layer == want.kept_per_layer
        assert got.eviction_s > 0 and got.prefill_s > 0


def test_whole_prompt_methods_keep_the_two_phase_path(tiny_llama):
    model, tokenizer = tiny_llama
    press = make_method("laq", **SETTINGS["laq"])
    with pytest.raises(ValueError, match="no layer-streamed eviction"):
        streamed_compress(model, press, prompt(model), [12] * 3)
    ids = prompt(model)
    want = Compressor(model, tokenizer, press, 12).compress(ids)
    got = Compressor(model, tokenizer, press, 12, streamed=True).compress(ids)
    assert all(torch.equal(a, b) for a, b in zip(got.kept, want.kept, strict=True))
    assert got.scores is not None  # scored on the full cache, as before


def test_streamed_cache_never_holds_two_full_layers(tiny_llama):
    """Whenever a decoder layer starts (prompt or lookahead tokens), at most one layer holds more than its budget."""
    model, tokenizer = tiny_llama
    press = build_press("lookaheadkv", model)
    model = press.base_model
    seen: list[list[int]] = []

    def record(module, args, kwargs):
        seen.append([layer.get_seq_length() for layer in kwargs[CACHE_KWARG].layers])

    hooks = [
        layer.register_forward_pre_hook(record, with_kwargs=True) for layer in model.get_decoder().layers
    ]
    try:
        Compressor(model, tokenizer, press, 12, streamed=True).compress(prompt(model))
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == 2 * len(hooks)  # each layer: the prompt, then the lookahead tokens
    assert [lengths.count(PROMPT_LEN) for lengths in seen] == [0, 1] * len(hooks)
    for lengths in seen:
        assert sum(length > 12 for length in lengths) <= 1, lengths


def test_eval_streamed_gives_the_same_rows(tiny_llama, tiny_corpus, tmp_path):
    from lkv.eval.runner import Evaluator

    model, tokenizer = tiny_llama
    presses = {"snapkv": make_method("snapkv", window=4), "laq": make_method("laq", **SETTINGS["laq"])}
    runs = {
        streamed: Evaluator(
            model,
            tokenizer,
            presses,
            [8, 0.5],
            ["aware", "agnostic"],
            tmp_path / str(streamed),
            False,
            streamed,
        ).run([tiny_needle_task(tiny_corpus)])
        for streamed in (False, True)
    }
    fields = ("method", "budget", "setting", "answer_ids", "kept_tokens", "kv_fraction")
    # (in key order: batched answers are written as their batch finishes, streamed ones at once)
    assert sorted([row[f] for f in fields] for row in runs[True]) == sorted(
        [row[f] for f in fields] for row in runs[False]
    )
    assert len(runs[True]) == 2 * 2 * 2
