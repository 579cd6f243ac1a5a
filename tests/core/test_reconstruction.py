"""The attention-input capture and KVzip+ scores against independent references (hooks on a plain forward)."""

import pytest
import torch

from lkv.core.attention import HiddenCapture
from lkv.core.generation import prefill
from lkv.core.reconstruction import REPEAT_INSTRUCTION, kvzip_plus_scores, reconstruction_block
from tests.reference import eager_attentions


def test_hidden_capture_holds_each_layers_normed_input(tiny_model):
    model, _ = tiny_model
    ids = torch.randint(0, model.config.vocab_size, (1, 23), generator=torch.Generator().manual_seed(0))
    capture = HiddenCapture()
    prefill(model, ids, lkv_capture=[capture])
    with torch.no_grad():
        residual = model(ids, output_hidden_states=True).hidden_states  # the stream entering each layer
    layers = model.get_decoder().layers
    want = torch.stack([layer.input_layernorm(residual[i]) for i, layer in enumerate(layers)], dim=1)
    got = capture.stacked(len(layers))
    assert got.shape == (1, len(layers), 23, model.config.hidden_size)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    with pytest.raises(RuntimeError, match="expected 0..3"):
        capture.stacked(4)


def test_hidden_capture_reduces_each_layer_as_it_is_observed(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    plain, reduced = HiddenCapture(), HiddenCapture(lambda layer, h: h.sum(-1) + layer)
    prefill(model, ids, lkv_capture=[plain, reduced])
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(reduced.take(layer), plain.take(layer).sum(-1) + layer)
    with pytest.raises(RuntimeError, match="no attention input was captured for layer 0"):
        reduced.take(0)


def kvzap_reference(model, prompt: list[int], block: list[int], repeated: int) -> torch.Tensor:
    """KVzap's data collection (kvpress kvzap/data.py), by hand: one eager forward over prompt + block, then
    log max over the repeated queries and the group's heads of a[t, j] / ‖x[t]‖ · ‖v[j] W_o‖."""
    ids = torch.tensor([prompt + block])
    captured = {}

    def keep_input(module, args, kwargs):
        captured[module.layer_idx] = kwargs["hidden_states"]

    layers = model.get_decoder().layers
    handles = [layer.self_attn.register_forward_pre_hook(keep_input, with_kwargs=True) for layer in layers]
    try:
        attentions = eager_attentions(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    total, prompt_len = ids.shape[1], len(prompt)
    out = []
    for index, layer in enumerate(layers):
        hidden = captured[index][0]  # (T, hidden)
        values = layer.self_attn.v_proj(hidden).view(total, kv_heads, head_dim)
        values = values.repeat_interleave(heads // kv_heads, dim=1)  # (T, heads, d), query-head order
        w_o = layer.self_attn.o_proj.weight.T.reshape(heads, head_dim, -1)
        value_out = torch.einsum("thi,hij->htj", values, w_o).norm(dim=-1)  # (heads, T)
        rows = attentions[index][0] / hidden.norm(dim=-1)[None, :, None] * value_out[:, None, :]
        block = rows[:, total - repeated :, :prompt_len].amax(dim=1)  # (heads, S)
        out.append(block.view(kv_heads, heads // kv_heads, prompt_len).amax(dim=1).log())
    return torch.stack(out)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_kvzip_plus_scores_match_kvzaps_recipe(make_tiny_model, attn):
    for family in ("llama", "qwen"):
        model, tokenizer = make_tiny_model(family, attn_implementation=attn)
        prompt = torch.randint(0, 300, (31,), generator=torch.Generator().manual_seed(2)).tolist()
        block = reconstruction_block(tokenizer, prompt)
        assert block[-31:] == prompt and REPEAT_INSTRUCTION in tokenizer.decode(block[:-31])
        cache, _ = prefill(model, torch.tensor([prompt]))
        got = kvzip_plus_scores(model, cache, 31, torch.tensor([block]), repeated=31)
        assert cache.get_seq_length() == 31  # cropped back
        want = kvzap_reference(model, prompt, block, repeated=31)
        assert got.shape == (model.config.num_hidden_layers, model.config.num_key_value_heads, 31)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=family)
        # the instruction's queries do not count: scoring from every block query gives other maxima
        every = kvzip_plus_scores(model, cache, 31, torch.tensor([block]), repeated=len(block))
        assert not torch.allclose(every, got)
