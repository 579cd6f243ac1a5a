"""Importance capture against an independent eager ``output_attentions`` reference."""

import pytest
import torch
from transformers.utils import is_torch_flex_attn_available

import lkv.core.attention as attention
from lkv.core.attention import ImportanceCapture, install_capture
from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill
from tests.reference import eager_reference


def block_on_cache(model, ids: torch.Tensor, prompt_len: int, **capture_kwargs) -> torch.Tensor:
    cache, _ = prefill(model, ids[:, :prompt_len])
    capture = ImportanceCapture(num_keys=prompt_len, **capture_kwargs)
    with torch.no_grad():
        model(input_ids=ids[:, prompt_len:], **cache_kwargs(cache), use_cache=True, lkv_capture=capture)
    return capture.scores(model.config.num_hidden_layers)[0]


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_block_capture_matches_eager_reference(tiny_model, base):
    model, _ = tiny_model
    model.set_attn_implementation(base)
    install_capture(model)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 37))
    got = block_on_cache(model, ids, prompt_len=29)
    want = eager_reference(model, ids, num_keys=29, first_query=29)
    assert got.shape == (model.config.num_hidden_layers, model.config.num_key_value_heads, 29)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:2]), atol=1e-6, rtol=0)


def test_window_of_a_prefill_matches_reference(tiny_model):
    """SnapKV-style: the last w queries of the prompt's own prefill vote on the whole prompt."""
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 30))
    capture = ImportanceCapture(num_keys=30, last_queries=6)
    prefill(model, ids, lkv_capture=capture)
    got = capture.scores(model.config.num_hidden_layers)[0]
    torch.testing.assert_close(
        got, eager_reference(model, ids, num_keys=30, first_query=24), atol=1e-5, rtol=0
    )


def test_several_captures_share_one_prefill(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 30))
    window, everything = ImportanceCapture(num_keys=30, last_queries=6), ImportanceCapture(num_keys=30)
    prefill(model, ids, lkv_capture=[window, everything])
    for capture, first in ((window, 24), (everything, 0)):
        want = eager_reference(model, ids, num_keys=30, first_query=first)
        torch.testing.assert_close(capture.scores()[0], want, atol=1e-5, rtol=0)


def test_query_chunking_is_exact(tiny_model, monkeypatch):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    whole = block_on_cache(model, ids, prompt_len=25)
    # Force one query per chunk: the on-the-fly reduction must not depend on chunking.
    monkeypatch.setattr(attention, "_CHUNK_ELEMENTS", 1)
    torch.testing.assert_close(block_on_cache(model, ids, prompt_len=25), whole, atol=1e-6, rtol=0)


def test_pieces_accumulate_like_one_block(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 36))
    whole = block_on_cache(model, ids, prompt_len=24)
    cache, _ = prefill(model, ids[:, :24])
    capture = ImportanceCapture(num_keys=24)
    with torch.no_grad():
        for start, stop in ((24, 28), (28, 33), (33, 36)):
            model(input_ids=ids[:, start:stop], **cache_kwargs(cache), use_cache=True, lkv_capture=capture)
    torch.testing.assert_close(capture.scores()[0], whole, atol=1e-5, rtol=0)


def test_capture_leaves_outputs_unchanged(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 20))
    with torch.no_grad():
        plain = model(ids).logits
        captured = model(ids, lkv_capture=ImportanceCapture(num_keys=20)).logits
    assert torch.equal(plain, captured)
    assert install_capture(model) == model.config._attn_implementation  # idempotent


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_capture_that_computes_the_output_replaces_the_layer_kernel(tiny_model, base, monkeypatch):
    """The lookahead step's capture returns the block's attention output; the layer's kernel is skipped."""
    model, _ = tiny_model
    model.set_attn_implementation(base)
    install_capture(model)
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 37))
    block = torch.randn(1, 5, model.config.hidden_size, requires_grad=True)
    results = {}
    for computes_output in (False, True):
        kernel_calls: list[int] = []
        real = attention._base_attention
        monkeypatch.setattr(
            attention, "_base_attention", lambda *a, _r=real, _c=kernel_calls: _c.append(1) or _r(*a)
        )
        cache, _ = prefill(model, ids)
        kernel_calls.clear()
        capture = ImportanceCapture(num_keys=37, computes_output=computes_output)
        hidden = model.get_decoder()(
            inputs_embeds=block, **cache_kwargs(cache), use_cache=True, lkv_capture=capture
        )
        weights = torch.linspace(-1, 1, hidden.last_hidden_state.numel()).view_as(hidden.last_hidden_state)
        grad = torch.autograd.grad((hidden.last_hidden_state * weights).sum(), block)[0]
        results[computes_output] = (hidden.last_hidden_state, capture.scores(), grad, len(kernel_calls))
        monkeypatch.undo()
    (h0, s0, g0, calls0), (h1, s1, g1, calls1) = results[False], results[True]
    assert calls0 == model.config.num_hidden_layers and calls1 == 0
    torch.testing.assert_close(h1, h0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s0, atol=1e-6, rtol=0)
    torch.testing.assert_close(g1, g0, atol=1e-4 * g0.abs().max().item(), rtol=1e-4)
    with pytest.raises(ValueError, match="last_queries"):
        ImportanceCapture(num_keys=4, last_queries=2, computes_output=True)


def test_capture_is_differentiable(tiny_model):
    """Lookahead training backpropagates through the captured scores into the block's inputs."""
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    cache, _ = prefill(model, ids)
    block = torch.randn(1, 3, model.config.hidden_size, requires_grad=True)
    capture = ImportanceCapture(num_keys=16)
    model(inputs_embeds=block, **cache_kwargs(cache), use_cache=True, lkv_capture=capture)
    scores = capture.scores(model.config.num_hidden_layers)
    (scores[0, -1, 0, :4].sum()).backward()
    assert block.grad is not None and block.grad.abs().sum() > 0


def test_missing_capture_is_a_clear_error():
    with pytest.raises(RuntimeError, match="install_capture"):
        ImportanceCapture(num_keys=4).scores()
    with pytest.raises(ValueError, match="num_keys"):
        ImportanceCapture(num_keys=0)


def test_capture_stays_fp32_under_bf16_autocast(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    plain = ImportanceCapture(num_keys=24, last_queries=4)
    prefill(model, ids, lkv_capture=plain)
    autocast = ImportanceCapture(num_keys=24, last_queries=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, lkv_capture=autocast, logits_to_keep=1)
    scores = autocast.scores()
    assert scores.dtype == torch.float32
    # the model itself ran in bf16, so only the rows' arithmetic is fp32: close, not equal
    torch.testing.assert_close(scores, plain.scores(), atol=2e-2, rtol=0)


@pytest.mark.skipif(
    not is_torch_flex_attn_available(),
    reason="torch before 2.5 has no flex attention: transformers refuses it",
)
def test_flex_attention_is_refused_with_the_supported_kernels(make_tiny_model):
    """Its BlockMask is not a tensor the capture could slice: refuse it by name."""
    with pytest.raises(ValueError, match=r"flex_attention.*BlockMask.*sdpa, eager"):
        make_tiny_model(attn_implementation="flex_attention")


def test_flex_attention_is_refused_before_loading_weights(tmp_path):
    from lkv.model.backbone import load_backbone

    with pytest.raises(ValueError, match="flex_attention"):
        load_backbone(str(tmp_path / "never-read"), attn_implementation="flex_attention")
