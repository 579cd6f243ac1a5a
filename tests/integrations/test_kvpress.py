"""lkv presses inside NVIDIA kvpress: same kept positions and K/V as lkv's own layer-streamed eviction.

Runs in the kvpress environment (``make kvpress-test``); skipped where kvpress is not installed.
"""

import pytest
import torch
from transformers import DynamicCache

pytest.importorskip("kvpress")

from kvpress import KVPressTextGenerationPipeline  # noqa: E402
from kvpress.utils import compute_n_kept  # noqa: E402

from lkv.core.cache import key_mask  # noqa: E402
from lkv.core.compat import cache_kwargs  # noqa: E402
from lkv.core.generation import Sampling  # noqa: E402
from lkv.eviction.compressor import Compressor  # noqa: E402
from lkv.eviction.presses import LookaheadKVPress, Press  # noqa: E402
from lkv.eviction.presses.fused import RULES  # noqa: E402
from lkv.eviction.presses.lookaheadkv import lookahead_press as module_press  # noqa: E402
from lkv.eviction.registry import make_method  # noqa: E402
from lkv.eviction.selector import Selection, adaptive_width  # noqa: E402
from lkv.eviction.streamed import streamed_compress  # noqa: E402
from lkv.integrations.kvpress import LkvPress, lookahead_press  # noqa: E402
from tests.conftest import FAMILIES, build_tiny_model  # noqa: E402
from tests.eviction.conftest import PROMPT_LEN, SETTINGS, build_press, prompt  # noqa: E402
from tests.reference import evicted_reference_logits, keep_mask  # noqa: E402

UNIFORM = [
    "snapkv",
    "tova",
    "h2o",
    "streamingllm",
    "random",
    "lookaheadkv",
    "expected_attention",
    "keydiff",
    "probe",
    *(f"lookaheadkv+probe ({rule})" for rule in RULES),
]
# the probe's weight in the fused presses: unequal, so a swap of the weights would show
FUSED_WEIGHT = 0.3


def build(method: str, model) -> Press:
    """``build_press``, plus ``lookaheadkv+probe (<rule>)``: lkv's own press of the lookahead module fused with
    the probe by that rule (pooled as a loaded module pools)."""
    if not method.startswith("lookaheadkv+probe"):
        return build_press(method, model)
    rule = method.split("(")[1].rstrip(")")
    module, probe = build_press("lookaheadkv", model).adapter, build_press("probe", model)
    return module_press(module, probe, {"probe_weight": FUSED_WEIGHT, "fusion": rule})


def kvpress_prefill(model, press: LkvPress, ids: torch.Tensor) -> DynamicCache:
    """The context's prefill as kvpress's pipeline runs it: the decoder alone, under the press's hooks."""
    cache = DynamicCache(config=model.config)
    with press(model), torch.no_grad():
        model.model(input_ids=ids, **cache_kwargs(cache))
    return cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", UNIFORM)
@pytest.mark.parametrize("ratio", [0.75, 0.5, 0.1])
def test_kvpress_hook_keeps_what_lkv_streamed_eviction_keeps(family, method, ratio):
    model, _ = build_tiny_model(family)
    lkv_press = build(method, model)
    model = lkv_press.base_model if isinstance(lkv_press, LookaheadKVPress) else model
    ids = prompt(model)
    budget = compute_n_kept(PROMPT_LEN, ratio)
    sink, recent = lkv_press.protected(PROMPT_LEN)
    budgets = lkv_press.layer_budgets(budget, PROMPT_LEN, model.config.num_hidden_layers)
    want = streamed_compress(model, lkv_press, ids, budgets, Selection(sink, recent)).cache
    got = kvpress_prefill(model, LkvPress(lkv_press, compression_ratio=ratio), ids)
    for layer, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
        assert a.keys.shape[2] == budget, f"layer {layer} keeps {a.keys.shape[2]} entries, not {budget}"
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {layer} K/V"


def kept_entries(layer) -> list[torch.Tensor]:
    """Per KV head the ``(n, head_dim)`` keys a cache layer really keeps (masked slots left out)."""
    mask = key_mask(layer, layer.keys.shape[2])
    return [
        layer.keys[0, h] if mask is None else layer.keys[0, h][mask[0, h]] for h in range(layer.keys.shape[1])
    ]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["snapkv", "expected_attention", "keydiff", "lookaheadkv"])
def test_kvpress_hook_honours_adaptive_head_budgets(family, method):
    model, _ = build_tiny_model(family)
    lkv_press = build_press(method, model)
    model = lkv_press.base_model if isinstance(lkv_press, LookaheadKVPress) else model
    ids = prompt(model)
    ratio = 0.75
    budget = compute_n_kept(PROMPT_LEN, ratio)
    sink, recent = lkv_press.protected(PROMPT_LEN)
    budgets = lkv_press.layer_budgets(budget, PROMPT_LEN, model.config.num_hidden_layers)
    want = streamed_compress(
        model, lkv_press, ids, budgets, Selection(sink, recent, head_budget="adaptive")
    ).cache
    got = kvpress_prefill(
        model, LkvPress(lkv_press, compression_ratio=ratio, selection=Selection(head_budget="adaptive")), ids
    )
    width = adaptive_width(budget, model.config.num_key_value_heads, PROMPT_LEN)
    for layer, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
        assert a.keys.shape[2] == width, f"layer {layer}: {a.keys.shape[2]} slots, not the uniform {width}"
        for head, (mine, theirs) in enumerate(zip(kept_entries(a), kept_entries(b), strict=True)):
            assert torch.equal(mine, theirs), f"layer {layer}, head {head}: other entries kept"


@pytest.mark.parametrize("family", FAMILIES)
def test_question_block_on_an_adaptive_kvpress_cache_matches_the_masked_full_cache(family):
    """kvpress's pipeline appends the question as one block on the uniformly wide, masked cache: its logits
    equal a full-cache forward with each head's evicted prompt keys masked."""
    model, _ = build_tiny_model(family)
    press = make_method("snapkv", window=4)
    ids, question = prompt(model), torch.tensor([[5, 6, 7, 8, 9]])
    budget = compute_n_kept(PROMPT_LEN, 0.75)
    kept = streamed_compress(
        model,
        press,
        ids,
        [budget] * model.config.num_hidden_layers,
        Selection(recent=4, head_budget="adaptive"),
    ).kept
    keep = keep_mask(kept, PROMPT_LEN)
    cache = kvpress_prefill(
        model, LkvPress(press, compression_ratio=0.75, selection=Selection(head_budget="adaptive")), ids
    )
    positions = torch.arange(PROMPT_LEN, PROMPT_LEN + question.shape[1])[None]
    with torch.no_grad():
        got = model(input_ids=question, position_ids=positions, **cache_kwargs(cache)).logits[0].float()
    want = evicted_reference_logits(model, torch.cat([ids, question], dim=1), keep)[PROMPT_LEN:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_kvpress_pipeline_with_adaptive_head_budgets_answers_as_lkv(tiny_qwen):
    """End to end: the pipeline's answer (question appended as one block) is lkv's own (each layer as wide as
    its widest head, the question appended token by token)."""
    model, tokenizer = tiny_qwen
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    context = (
        "The quick brown fox jumps over the lazy dog. A startup is a company designed to grow fast. " * 3
    )
    press = LkvPress(
        make_method("snapkv", window=4), compression_ratio=0.5, selection=Selection(head_budget="adaptive")
    )
    got = pipe(context, question="Who jumps?", press=press, max_new_tokens=6)["answer"]
    inputs = pipe.preprocess(context, ["Who jumps?"], "", 10**6)
    ids, question = inputs["context_ids"], inputs["questions_ids"][0][0].tolist()
    budget = compute_n_kept(ids.shape[1], 0.5)
    compressor = Compressor(
        model,
        tokenizer,
        make_method("snapkv", window=4),
        budget,
        Selection(head_budget="adaptive"),
        streamed=True,
    )
    assert got == compressor.answer(compressor.compress(ids), question, Sampling(max_new_tokens=6)).text


def test_kvpress_pipeline_answers_from_the_compressed_context(tiny_llama):
    """Question-agnostic: kvpress compresses the context, then asks each question on a copy of that cache."""
    model, tokenizer = tiny_llama
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    context = "The quick brown fox jumps over the lazy dog. " * 6
    press = LkvPress(make_method("snapkv", window=4), compression_ratio=0.5)
    out = pipe(context, questions=["Who jumps?", "Over what?"], press=press, max_new_tokens=4)
    context_len = len(pipe.preprocess(context, [""], "", 10**6)["context_ids"][0])
    cache = kvpress_prefill(model, press, pipe.preprocess(context, [""], "", 10**6)["context_ids"])
    assert [layer.keys.shape[2] for layer in cache.layers] == [compute_n_kept(context_len, 0.5)] * 3
    assert len(out["answers"]) == 2 and all(isinstance(answer, str) for answer in out["answers"])


def test_zero_ratio_compresses_nothing(tiny_llama):
    model, _ = tiny_llama
    cache = kvpress_prefill(model, LkvPress(make_method("tova"), compression_ratio=0.0), prompt(model))
    assert [layer.keys.shape[2] for layer in cache.layers] == [PROMPT_LEN] * 3


def test_presses_kvpress_cannot_run_are_refused(tiny_llama):
    model, _ = tiny_llama
    with pytest.raises(ValueError, match="layer-streamable"):
        LkvPress(make_method("laq", **SETTINGS["laq"]), compression_ratio=0.5)
    with pytest.raises(ValueError, match="same length"):
        kvpress_prefill(
            model, LkvPress(make_method("pyramidkv", window=4), compression_ratio=0.5), prompt(model)
        )
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        LkvPress(make_method("tova"), compression_ratio=1.0)


def test_lookahead_press_loads_an_exported_adapter(tmp_path):
    model, _ = build_tiny_model("llama")
    trained = LookaheadKVPress(
        build_press("lookaheadkv", model).adapter
    )  # the default kernel, as loading gives
    trained.adapter.save(tmp_path / "adapter")
    ids = prompt(model)
    want = kvpress_prefill(model, LkvPress(trained, compression_ratio=0.5), ids)
    fresh, _ = build_tiny_model("llama")
    got = kvpress_prefill(fresh, lookahead_press(tmp_path / "adapter", fresh, compression_ratio=0.5), ids)
    for a, b in zip(got.layers, want.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-6)


def same_cache(a: DynamicCache, b: DynamicCache) -> bool:
    return all(torch.equal(x.keys, y.keys) for x, y in zip(a.layers, b.layers, strict=True))


@pytest.mark.parametrize("fusion", RULES)
def test_lookahead_press_fuses_an_exported_adapter_with_an_exported_probe(tmp_path, fusion):
    model, tokenizer = build_tiny_model("llama")
    module, probe = build_press("lookaheadkv", model).adapter, build_press("probe", model)
    module.save(tmp_path / "adapter")
    probe.probe.save(tmp_path / "probe")
    ids = prompt(model)

    def lkv(probe=None, tokenizer=None, **settings) -> DynamicCache:
        press = module_press(module, probe, settings, tokenizer)
        return kvpress_prefill(model, LkvPress(press, compression_ratio=0.5), ids)

    fresh, _ = build_tiny_model("llama")

    def matches_lkv(ids: torch.Tensor, **settings) -> DynamicCache:
        """The exported folders in kvpress's pipeline keep what lkv's own fused press keeps; returns that cache."""
        want = lkv(probe=probe, probe_weight=FUSED_WEIGHT, fusion=fusion, **settings)
        tokenizer = settings.pop("tokenizer", None)
        press = lookahead_press(
            tmp_path / "adapter",
            fresh,
            0.5,
            probe=tmp_path / "probe",
            settings={"probe_weight": FUSED_WEIGHT, "fusion": fusion, **settings},
            tokenizer=tokenizer,
        )
        got = kvpress_prefill(fresh, press, ids)
        for a, b in zip(got.layers, want.layers, strict=True):
            torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-6)
        return want

    want = matches_lkv(ids)
    # the probe and the rule change what is kept on this prompt: a press that ignored either would differ
    other = next(rule for rule in RULES if rule != fusion)
    assert not same_cache(want, lkv())
    assert not same_cache(want, lkv(probe=probe, probe_weight=FUSED_WEIGHT, fusion=other))
    # half of the budget to whole sentences, read from the tokenizer given (on ids the tokenizer has)
    ids = ids % len(tokenizer)
    want = matches_lkv(ids, sentences=0.5, sentences_beyond=ids.shape[1] // 3, tokenizer=tokenizer)
    scaled = matches_lkv(
        ids, sentences=0.5, sentences_beyond=ids.shape[1] // 3, sentences_scaled=True, tokenizer=tokenizer
    )
    assert not same_cache(scaled, want)
    assert not same_cache(want, lkv(probe=probe, probe_weight=FUSED_WEIGHT, fusion=fusion))


def test_lookahead_press_refuses_bad_fusion_settings_before_loading(tmp_path, tiny_llama):
    model, _ = tiny_llama
    missing = tmp_path / "missing"  # nothing to load: a FileNotFoundError would mean the check came too late
    with pytest.raises(ValueError, match="fuse the module with a probe .*there is none: give --probe"):
        lookahead_press(missing, model, 0.5, settings={"probe_weight": 0.5})
    with pytest.raises(ValueError, match="the settings fuse no probe"):
        lookahead_press(missing, model, 0.5, probe=missing)
    with pytest.raises(ValueError, match="fusion given without probe_weight > 0"):
        lookahead_press(missing, model, 0.5, settings={"fusion": "union"})
    with pytest.raises(ValueError, match="fusion rule must be one of"):
        lookahead_press(missing, model, 0.5, probe=missing, settings={"probe_weight": 0.5, "fusion": "max"})
    with pytest.raises(ValueError, match=r"probe_weight must be a number in \(0, 1\]"):
        lookahead_press(missing, model, 0.5, probe=missing, settings={"probe_weight": 1.5})
    with pytest.raises(ValueError, match="give the tokenizer"):
        lookahead_press(missing, model, 0.5, settings={"sentences": 0.5})
    with pytest.raises(ValueError, match="give the tokenizer"):
        lookahead_press(missing, model, 0.5, probe=missing, settings="long")
