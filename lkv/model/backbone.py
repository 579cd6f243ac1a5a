"""Load a frozen causal LM and its tokenizer, and describe it by a :class:`ModelSignature`.

One loader serves every model lkv touches: a short name of an embedded asset (``smollm2-135m``), a local
Hugging Face folder, a local ``.gguf`` file, or a hub id when online. The model comes back in eval mode,
with every parameter frozen and its attention routed through :func:`lkv.core.attention.install_capture`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lkv.core.attention import check_attn_implementation, install_capture
from lkv.model import assets
from lkv.model.gguf import load_gguf

DEFAULT_MODEL = assets.DEFAULT_MODEL
# short name → folder of the converted embedded asset, fetched on first use (looked up at call time, so a
# patched or re-pointed `assets.model_dir` takes effect)
SHORT_NAMES: dict[str, Callable[[], Path]] = {DEFAULT_MODEL: lambda: assets.model_dir()}
DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}


def load_backbone(
    model: str = DEFAULT_MODEL,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a frozen causal LM and its tokenizer, its weights read straight onto ``device``.

    Args:
        model: a short name (``smollm2-135m``), a local HF folder, a local ``.gguf`` file, or a hub id.
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the checkpoint's own dtype).
        attn_implementation: the base attention that lkv's capturing wrapper calls: ``sdpa`` or ``eager``
            (``flash_attention_2`` untested; ``flex_attention`` refused, see
            :func:`lkv.attention.check_attn_implementation`).
        device: where the weights are loaded (``cpu``, ``cuda:1``, ``meta``, ...), passed to transformers as
            ``device_map``: each tensor goes from the checkpoint to that device, so 8 ranks loading an 8B
            model never hold 8 × 15 GiB in host memory. None loads on the CPU.

    Returns:
        ``(model, tokenizer)``: model in eval mode with ``requires_grad=False`` everywhere and score
        capture installed; tokenizer with ``pad_token`` set (to EOS when it had none).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    check_attn_implementation(attn_implementation)  # before minutes of loading
    torch_dtype = DTYPES[dtype]
    path = Path(model).expanduser()
    if model in SHORT_NAMES:
        net, tokenizer = _load_pretrained(SHORT_NAMES[model](), torch_dtype, attn_implementation, device)
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model {model!r}: no such GGUF file")
        net, tokenizer = load_gguf(path, torch_dtype, attn_implementation, device)
    elif path.is_dir():
        net, tokenizer = _load_pretrained(path, torch_dtype, attn_implementation, device)
    elif model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise FileNotFoundError(
            f"model {model!r}: no such folder (expected a short name ({', '.join(SHORT_NAMES)}), an existing "
            "HF folder, a .gguf file or a hub id 'org/name')"
        )
    else:
        try:
            net, tokenizer = _load_pretrained(model, torch_dtype, attn_implementation, device)
        except OSError as error:
            raise OSError(
                f"could not load model {model!r}: it is not a short name ({', '.join(SHORT_NAMES)}), a local "
                f"folder or a .gguf file, so it was tried as a Hugging Face hub id, which failed: {error}"
            ) from error
    net.eval().requires_grad_(False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    install_capture(net)
    return net, tokenizer


def _load_pretrained(
    source: str | Path, dtype: torch.dtype | str, attn_implementation: str, device: str | torch.device | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    net = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation=attn_implementation, device_map=device
    )
    return net, AutoTokenizer.from_pretrained(source)


@dataclass(frozen=True)
class ModelSignature:
    """What labels depend on: architecture shape and tokenizer (not the path the weights came from).

    Attributes:
        name: how the model was named when loaded (informational; not compared).
        tokenizer: :func:`tokenizer_fingerprint` of the tokenizer.
    """

    name: str
    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tokenizer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSignature:
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"model signature is missing {missing} (found keys {sorted(data)})")
        return cls(**{n: data[n] for n in names})

    def describe(self) -> str:
        """``'name' (model_type, L layers, H heads, KV KV heads, head_dim d, vocab V, tokenizer T)``."""
        return (
            f"{self.name!r} ({self.model_type}, {self.num_layers} layers, {self.num_heads} heads, "
            f"{self.num_kv_heads} KV heads, head_dim {self.head_dim}, vocab {self.vocab_size}, "
            f"tokenizer {self.tokenizer})"
        )


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """First 16 hex digits of the sha256 of the sorted vocabulary and the special tokens."""
    content = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": sorted(tokenizer.all_special_tokens),
    }
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode()).hexdigest()[:16]


def model_signature(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str) -> ModelSignature:
    """The :class:`ModelSignature` of a loaded model; ``name`` is how it was asked for."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    return ModelSignature(
        name=name,
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        tokenizer=tokenizer_fingerprint(tokenizer),
    )


def check_compatible(expected: ModelSignature, found: ModelSignature, where: str) -> None:
    """Raise if ``found`` (the loaded model) differs from ``expected`` (what made ``where``) in any field.

    ``name`` is not compared: one model reached by short name, folder or hub id is still the same model.

    Raises:
        ValueError: naming ``where``, both models, and every mismatched field with both values.
    """
    mismatched = [
        f"{f.name}: {getattr(expected, f.name)!r} vs {getattr(found, f.name)!r}"
        for f in fields(ModelSignature)
        if f.name != "name" and getattr(expected, f.name) != getattr(found, f.name)
    ]
    if mismatched:
        raise ValueError(
            f"{where}: made by model {expected.describe()}, but the loaded model is {found.describe()}; "
            f"mismatched: {'; '.join(mismatched)}"
        )
