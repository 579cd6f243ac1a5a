"""lkv presses inside NVIDIA kvpress: same kept positions and K/V as lkv's own layer-streamed eviction.

Runs in the kvpress environment (``make kvpress-test``); skipped where kvpress is not installed.
"""

import pytest
import torch
from transformers import DynamicCache

pytest.importorskip("kvpress")

from kvpress import KVPressTextGenerationPipeline  # noqa: E402
from kvpress.utils import compute_n_kept  # noqa: E402

from lkv.core.compat import cache_kwargs  # noqa: E402
from lkv.eviction.presses import LookaheadKVPress  # noqa: E402
from lkv.eviction.registry import make_method  # noqa: E402
from lkv.eviction.streamed import streamed_compress  # noqa: E402
from lkv.integrations.kvpress import LkvPress, lookahead_press  # noqa: E402
from tests.conftest import FAMILIES, build_tiny_model  # noqa: E402
from tests.eviction.conftest import PROMPT_LEN, SETTINGS, build_press, prompt  # noqa: E402

UNIFORM = ["snapkv", "tova", "h2o", "streamingllm", "random", "lookaheadkv", "probe"]


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
    lkv_press = build_press(method, model)
    model = lkv_press.base_model if isinstance(lkv_press, LookaheadKVPress) else model
    ids = prompt(model)
    budget = compute_n_kept(PROMPT_LEN, ratio)
    sink, recent = lkv_press.protected(PROMPT_LEN)
    budgets = lkv_press.layer_budgets(budget, PROMPT_LEN, model.config.num_hidden_layers)
    want = streamed_compress(model, lkv_press, ids, budgets, sink, recent).cache
    got = kvpress_prefill(model, LkvPress(lkv_press, compression_ratio=ratio), ids)
    for layer, (a, b) in enumerate(zip(got.layers, want.layers, strict=True)):
        assert a.keys.shape[2] == budget, f"layer {layer} keeps {a.keys.shape[2]} entries, not {budget}"
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), f"layer {layer} K/V"


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
    trained = build_press("lookaheadkv", model)
    trained.adapter.save(tmp_path / "adapter")
    ids = prompt(model)
    want = kvpress_prefill(model, LkvPress(trained, compression_ratio=0.5), ids)
    fresh, _ = build_tiny_model("llama")
    got = kvpress_prefill(fresh, lookahead_press(tmp_path / "adapter", fresh, compression_ratio=0.5), ids)
    for a, b in zip(got.layers, want.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-6)
