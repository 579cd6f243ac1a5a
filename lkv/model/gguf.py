"""GGUF → dense transformers model: the one-off conversion of the embedded default's weights."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lkv.core.compat import gguf_dense_kwargs


def load_gguf(
    path: Path,
    dtype: torch.dtype | str = torch.float32,
    attn_implementation: str = "sdpa",
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A dense model and its tokenizer from a ``.gguf`` file, with no quantization state left.

    ``GgufConfig(dequantize=True)`` (:func:`~lkv.core.compat.gguf_dense_kwargs`; before transformers 5.17 every
    GGUF load is dense) unpacks every weight into a plain ``nn.Linear`` and has transformers remove
    ``config.quantization_config`` and ``hf_quantizer`` itself, so the model saves like any other.
    (Without it, transformers keeps a GGUF quantizer that refuses ``save_pretrained``, and where the
    ``kernels`` package is installed it leaves weights packed in GGUF blocks.)
    """
    net = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=dtype,
        attn_implementation=attn_implementation,
        **gguf_dense_kwargs(),
        device_map=device,
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return net, tokenizer
