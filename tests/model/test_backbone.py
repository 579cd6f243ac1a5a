"""Backbone loading (tiny models saved to folders) and model signatures."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from lkv.model import assets, backbone
from lkv.model.backbone import (
    ModelSignature,
    check_compatible,
    load_backbone,
    model_signature,
    tokenizer_fingerprint,
)


@pytest.fixture
def saved_tiny(tmp_path, tiny_model):
    """A tiny model and its tokenizer saved as an HF folder: ``(folder, model, tokenizer)``."""
    model, tokenizer = tiny_model
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def test_load_folder_gives_frozen_eval_model_with_capture(saved_tiny):
    folder, original, _ = saved_tiny
    model, tokenizer = load_backbone(str(folder))
    assert type(model) is type(original)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "lkv_sdpa"
    assert tokenizer.pad_token == "<|endoftext|>"
    ids = torch.tensor([tokenizer("the quick brown fox")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits)


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_dtype_option(saved_tiny, dtype, expected):
    model, _ = load_backbone(str(saved_tiny[0]), dtype=dtype, attn_implementation="eager")
    assert {p.dtype for p in model.parameters()} == {expected}
    assert model.config._attn_implementation == "lkv_eager"


def test_bad_dtype_is_refused(saved_tiny):
    with pytest.raises(
        ValueError, match=r"dtype must be one of \['float32', 'bfloat16', 'float16', 'auto'\], got 'fp8'"
    ):
        load_backbone(str(saved_tiny[0]), dtype="fp8")


def test_missing_pad_token_becomes_eos(tmp_path, tiny_llama):
    model, tokenizer = tiny_llama
    tokenizer.pad_token = None
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    _, loaded = load_backbone(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


def test_short_name_resolves_to_its_asset_folder(saved_tiny, monkeypatch):
    monkeypatch.setitem(backbone.SHORT_NAMES, "tiny", lambda: saved_tiny[0])
    model, _ = load_backbone("tiny")
    assert model.config.num_attention_heads == 4


def test_default_model_offline_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: network is unreachable\n")
    monkeypatch.setattr(assets.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(assets.AssetsMissingError, match="network is unreachable.*`lkv assets`"):
        load_backbone()


def test_missing_local_path_and_failed_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_backbone(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_backbone(str(tmp_path / "absent.gguf"))

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(backbone.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(
        OSError, match=r"could not load model 'org/model'.*tried as a Hugging Face hub id.*connect"
    ):
        load_backbone("org/model")


def test_signature_fields_and_round_trip(tiny_llama, tiny_qwen):
    llama = model_signature(*tiny_llama, name="tiny-llama")
    assert (llama.model_type, llama.num_layers, llama.num_heads, llama.num_kv_heads) == ("llama", 3, 4, 2)
    assert (llama.head_dim, llama.vocab_size, len(llama.tokenizer)) == (16, 320, 16)
    qwen = model_signature(*tiny_qwen, name="tiny-qwen")
    assert (qwen.model_type, qwen.num_layers, qwen.head_dim) == ("qwen3", 2, 16)
    assert ModelSignature.from_dict(json.loads(json.dumps(llama.to_dict()))) == llama
    with pytest.raises(ValueError, match=r"missing \['tokenizer'\]"):
        ModelSignature.from_dict({k: v for k, v in llama.to_dict().items() if k != "tokenizer"})


def test_tokenizer_fingerprint_is_stable_and_sensitive(tiny_tokenizer, make_tiny_model):
    fresh = make_tiny_model()[1]
    assert tokenizer_fingerprint(tiny_tokenizer) == tokenizer_fingerprint(fresh)
    tiny_tokenizer.add_tokens(["<extra>"])
    assert tokenizer_fingerprint(tiny_tokenizer) != tokenizer_fingerprint(fresh)


def test_check_compatible_lists_every_mismatch_with_both_sides(tiny_llama, tiny_qwen):
    llama = model_signature(*tiny_llama, name="A")
    qwen = model_signature(*tiny_qwen, name="B")
    check_compatible(llama, model_signature(*tiny_llama, name="other name, same model"), where="labels in x")
    with pytest.raises(ValueError) as info:
        check_compatible(llama, qwen, where="labels in data/x")
    message = str(info.value)
    assert message.startswith("labels in data/x: made by model 'A' (llama, 3 layers, 4 heads, 2 KV heads")
    assert ", but the loaded model is 'B' (qwen3, 2 layers" in message
    assert "model_type: 'llama' vs 'qwen3'" in message and "num_layers: 3 vs 2" in message
    assert "name:" not in message.split("mismatched:")[1]
