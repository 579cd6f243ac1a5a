"""Expected Attention, KVzip and KeyDiff against independent loop-based definitions on tiny models.

Each reference recomputes the method from a plain forward pass (hidden states, eager attention weights, the
model's own RoPE function), one head and one key at a time, in float64.
"""

import math
import sys

import pytest
import torch

from lkv.core.generation import prefill
from lkv.eviction.presses import PressContext
from lkv.eviction.presses.kvzip import REPEAT_PART_PROMPT, REPEAT_PROMPT
from lkv.eviction.registry import make_method
from tests.reference import eager_attentions

LENGTH = 40


def prompt(model, length: int = LENGTH) -> torch.Tensor:
    """Random ids past the special tokens (token 0, the padding id, embeds to zeros: a zero key has no direction)."""
    return torch.randint(3, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))


def scored(model, tokenizer, press, ids: torch.Tensor) -> torch.Tensor:
    """``press``'s ``(layers, kv_heads, S)`` scores after a prefill with its capture."""
    capture = press.prefill_capture(ids.shape[1])
    cache, logits = prefill(model, ids, **({} if capture is None else {"lkv_capture": capture}))
    return press.score(PressContext(model, ids, cache, logits, capture, tokenizer=tokenizer))[0]


@torch.no_grad()
def plain_forward(model, ids: torch.Tensor):
    """``(hidden states entering each layer, cache)`` of one plain forward pass."""
    out = model(ids, output_hidden_states=True, use_cache=True)
    return out.hidden_states, out.past_key_values


@torch.no_grad()
def average_rope(model, attention, positions: range) -> torch.Tensor:
    """``(d, d)`` the mean over ``positions`` of RoPE's matrix, column by column through the model's own RoPE."""
    rope = sys.modules[type(attention).__module__].apply_rotary_pos_emb
    d = attention.head_dim
    basis = torch.eye(d)[None, None]  # (1, 1, d, d): row j is e_j
    cos, sin = model.get_decoder().rotary_emb(basis, torch.tensor([list(positions)]))
    total = torch.zeros(d, d, dtype=torch.float64)
    for t in range(len(positions)):
        rotated, _ = rope(basis, basis, cos[:, t : t + 1].expand(1, d, d), sin[:, t : t + 1].expand(1, d, d))
        total += rotated[0, 0].double().T  # column j = R_t e_j
    return total / len(positions)


@torch.no_grad()
def expected_attention_loop(model, ids, n_future: int, n_sink: int, vnorm: bool = True) -> torch.Tensor:
    hidden, cache = plain_forward(model, ids)
    config = model.config
    heads, kv_heads, length = config.num_attention_heads, config.num_key_value_heads, ids.shape[1]
    group = heads // kv_heads
    out = torch.full((config.num_hidden_layers, kv_heads, length), math.inf, dtype=torch.float64)
    for layer_idx, layer in enumerate(model.get_decoder().layers):
        attention = layer.self_attn
        d = attention.head_dim
        normed = layer.input_layernorm(hidden[layer_idx])[0, n_sink:]
        queries = attention.q_proj(normed).view(normed.shape[0], heads, d)
        if hasattr(attention, "q_norm"):
            queries = attention.q_norm(queries)
        rotation = average_rope(model, attention, range(length, length + n_future))
        keys, values = cache.layers[layer_idx].keys[0].double(), cache.layers[layer_idx].values[0].double()
        for kv_head in range(kv_heads):
            mean_attention = torch.zeros(length - n_sink, dtype=torch.float64)
            for head in range(kv_head * group, (kv_head + 1) * group):
                q = queries[:, head].double()
                mu = rotation @ q.mean(0)
                sigma = rotation @ torch.cov(q.T, correction=0) @ rotation.T
                logits = [
                    float(keys[kv_head, j] @ mu) / math.sqrt(d)
                    + float(keys[kv_head, j] @ sigma @ keys[kv_head, j]) / (2 * d)
                    for j in range(n_sink, length)
                ]
                mean_attention += torch.softmax(torch.tensor(logits, dtype=torch.float64), 0) / group
            for j in range(n_sink, length):
                weight = float(values[kv_head, j].norm()) if vnorm else 1.0
                out[layer_idx, kv_head, j] = mean_attention[j - n_sink] * weight
    return out


def test_expected_attention_matches_its_definition(tiny_model):
    model, tokenizer = tiny_model
    ids = prompt(model)
    for settings in ({"n_future_positions": 16, "n_sink": 4}, {"n_future_positions": 7, "n_sink": 0}):
        press = make_method("expected_attention", **settings)
        want = expected_attention_loop(model, ids, settings["n_future_positions"], settings["n_sink"])
        torch.testing.assert_close(scored(model, tokenizer, press, ids).double(), want, rtol=1e-4, atol=1e-7)
    press = make_method("expected_attention", n_future_positions=16, use_vnorm=False)
    want = expected_attention_loop(model, ids, 16, 4, vnorm=False)
    torch.testing.assert_close(scored(model, tokenizer, press, ids).double(), want, rtol=1e-4, atol=1e-7)


def test_expected_attention_refuses_a_prompt_within_its_sinks(tiny_llama):
    with pytest.raises(ValueError, match="longer than its n_sink=4"):
        make_method("expected_attention").prefill_capture(4)


def test_keydiff_matches_its_definition(tiny_model):
    model, tokenizer = tiny_model
    ids = prompt(model)
    _, cache = plain_forward(model, ids)
    got = scored(model, tokenizer, make_method("keydiff"), ids)
    for layer_idx, layer in enumerate(cache.layers):
        for head in range(layer.keys.shape[1]):
            keys = layer.keys[0, head].double()
            anchor = sum(k / k.norm() for k in keys) / len(keys)
            want = [-float(k @ anchor) / float(k.norm() * anchor.norm()) for k in keys]
            torch.testing.assert_close(
                got[layer_idx, head].double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-5
            )


def kvzip_loop(
    model, tokenizer, ids: torch.Tensor, sink: int, chunk_size: int, overlap: int = 8
) -> torch.Tensor:
    """Per chunk, one eager forward of prompt + reconstruction block; each block query's attention row is
    renormalised over sink, chunk and block, and the chunk's entries take the max over queries and the group."""
    config = model.config
    length, kv_heads = ids.shape[1], config.num_key_value_heads
    group = config.num_attention_heads // kv_heads
    suffix = tokenizer("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    out = torch.full((config.num_hidden_layers, kv_heads, length), math.inf, dtype=torch.float64)
    tokens = ids[0].tolist()
    for start in range(sink, length, chunk_size):
        end = min(start + chunk_size, length)
        if start == sink:
            opening = tokenizer(REPEAT_PROMPT, add_special_tokens=False)["input_ids"]
        else:
            opening = (
                tokenizer(REPEAT_PART_PROMPT, add_special_tokens=False)["input_ids"]
                + tokens[start - overlap : start]
            )
        block = opening + suffix + tokens[start:end]
        attentions = eager_attentions(model, torch.tensor([tokens + block]))
        columns = [*range(sink), *range(start, end), *range(length, length + len(block))]
        for layer_idx, att in enumerate(attentions):
            for kv_head in range(kv_heads):
                for j in range(start, end):
                    best = 0.0
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        for row in range(length, length + len(block)):
                            weights = att[0, head, row].double()
                            best = max(best, float(weights[j] / weights[columns].sum()))
                    out[layer_idx, kv_head, j] = best
    return out


@pytest.mark.parametrize("chunk_size", [2048, 12])
def test_kvzip_matches_its_definition(tiny_model, chunk_size):
    model, tokenizer = tiny_model
    text = "The special magic number for maple is 7321945. A startup is a company designed to grow fast."
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    sink = len(tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"])
    got = scored(model, tokenizer, make_method("kvzip", chunk_size=chunk_size), ids)
    want = kvzip_loop(model, tokenizer, ids, sink, chunk_size)
    assert torch.isinf(got[..., :sink]).all() and torch.isfinite(got[..., sink:]).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


def test_kvzip_without_template_prefix_has_no_sink_and_needs_a_tokenizer(tiny_llama):
    model, tokenizer = tiny_llama
    ids = prompt(model)
    got = scored(model, tokenizer, make_method("kvzip", chunk_size=16), ids)
    assert torch.isfinite(got).all() and (got > 0).all()
    with pytest.raises(ValueError, match="give the Compressor a tokenizer"):
        scored(model, None, make_method("kvzip"), ids)
