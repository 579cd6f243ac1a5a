"""Models for benchmarks: real weights by name, or randomly initialised models of real architectures.

Timings and memory do not depend on weight values, so a GPU machine that reaches no hub and receives no
weights still measures e.g. Llama-3.1-8B at 32K tokens: ``random:llama-3.1-8b``. The architectures below
copy the shapes of the published configs (layers, widths, heads, vocabulary, RoPE settings).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PretrainedConfig, PreTrainedModel, Qwen3Config

from lkv.core.attention import install_capture

RANDOM_PREFIX = "random:"

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# name → (config class, its fields); published shapes of each model's config.json
ARCHITECTURES: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "llama-3.1-8b": (
        LlamaConfig,
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {**_LLAMA3_ROPE, "factor": 8.0},
            "tie_word_embeddings": False,
        },
    ),
    "llama-3.2-1b": (
        LlamaConfig,
        {
            "vocab_size": 128256,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": _LLAMA3_ROPE,
            "tie_word_embeddings": True,
        },
    ),
    "llama-3.2-3b": (
        LlamaConfig,
        {
            "vocab_size": 128256,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": _LLAMA3_ROPE,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-1.7b": (
        Qwen3Config,
        {
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-8b": (
        Qwen3Config,
        {
            "vocab_size": 151936,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": False,
        },
    ),
    "smollm2-135m": (
        LlamaConfig,
        {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
            "tie_word_embeddings": True,
        },
    ),
    # for tests and CPU dry runs of scripts/bench_gpu.sh
    "tiny-llama": (
        LlamaConfig,
        {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
        },
    ),
    # the Qwen3 architecture (q/k norms, explicit head_dim) at tiny size: CPU dry runs of scripts/smoke_gpu.sh
    "tiny-qwen3": (
        Qwen3Config,
        {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
        },
    ),
}


def random_model(
    architecture: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    seed: int = 0,
    num_layers: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised, frozen causal LM of a named architecture, built directly on ``device``.

    No end-of-sequence token is declared: benchmark generations always run their full length.

    Args:
        num_layers: decoder layers (every width, head count and the vocabulary unchanged; fewer than published
            make per-layer costs fit a small machine); default: the published count.
    """
    config = architecture_config(architecture, num_layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.eval().requires_grad_(False)
    install_capture(model)
    return model


def architecture_config(architecture: str, num_layers: int | None = None) -> PretrainedConfig:
    """The config of a named architecture (:data:`ARCHITECTURES`), optionally with ``num_layers`` decoder layers
    of its shape (fewer to fit a small machine; more to stack many cheap tiny layers in tests)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
    config_class, fields = ARCHITECTURES[architecture]
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be ≥ 1, got {num_layers}")
        fields = {**fields, "num_hidden_layers": num_layers}
    return config_class(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def load_model(
    model: str,
    dtype: str = "float32",
    device: str | None = None,
    attn_implementation: str = "sdpa",
    num_layers: int | None = None,
) -> PreTrainedModel:
    """``random:<architecture>`` (see :data:`ARCHITECTURES`) or anything :func:`lkv.model.backbone.load_backbone` loads.

    Args:
        num_layers: a random model's decoder layers (default: the architecture's); real weights keep theirs.
    """
    from lkv.model.backbone import DTYPES, load_backbone

    if dtype not in DTYPES or dtype == "auto":
        raise ValueError(f"dtype must be one of float32, bfloat16, float16, got {dtype!r}")
    if model.startswith(RANDOM_PREFIX):
        architecture = model[len(RANDOM_PREFIX) :]
        return random_model(
            architecture, DTYPES[dtype], device or "cpu", attn_implementation, num_layers=num_layers
        )
    if num_layers is not None:
        raise ValueError(f"num_layers applies to random:<architecture> models only, not to {model!r}")
    return load_backbone(model, dtype=dtype, attn_implementation=attn_implementation, device=device)[0]
