"""The naive training step that ``lkv bench --which train-step`` measures the two-phase step against.

One full-sequence forward + backward over ``[prompt; lookahead]`` with the LoRA applied at every position
and zeroed outside the lookahead tokens by a per-token mask (the "selective LoRA" of the guides): forward
hooks on peft's ``lora_B`` modules multiply their output by a ``(batch, seq, 1)`` mask. The prompt's
activations are then kept for backward and its positions run through the LoRA branch, although neither can
change the loss — exactly the work the two-phase step of :mod:`lkv.train.module` avoids. Both compute the same
loss and gradients (tests/perf/test_bench.py checks it), so the comparison is like for like.

Two naive variants differ only in how the lookahead rows' attention is read:

``capture``
    the model's own fused attention (sdpa) plus lkv's row-only capture: the strongest naive baseline,
    which shares every optimisation of the two-phase step except the split of the sequence.
``eager``
    the guides' way: eager attention with ``output_attentions=True``, then the lookahead rows are sliced
    out of the full ``(S+M)×(S+M)`` maps of every layer, which stay alive for backward
    (≈ 3 · L · H · (S+M)² · 4 B in fp32: 13 GiB for SmolLM2 at 2K, where 14 GiB was measured; 51 GiB at 4K).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from transformers import PreTrainedModel

from lkv.core.attention import ImportanceCapture
from lkv.core.metrics import importance_kl
from lkv.model.lookahead import LookaheadAdapter


@contextmanager
def masked_lora(model: torch.nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """Scale every LoRA update of ``model`` by ``mask (batch, seq, 1)`` (1 = adapted position, 0 = frozen).

    peft adds ``lora_B(lora_A(x)) · scaling`` to each adapted linear layer; masking ``lora_B``'s output
    masks the whole update per token.
    """
    hooks = [
        lora_b.register_forward_hook(lambda module, args, output: output * mask.to(output.dtype))
        for module in model.modules()
        if isinstance(module, LoraLayer)
        for lora_b in module.lora_B.values()
    ]
    if not hooks:
        raise ValueError("the model holds no LoRA layers to mask")
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


NaiveAttention = Literal["capture", "eager"]


def naive_importance(
    adapter: LookaheadAdapter, prompt_ids: torch.Tensor, attention: NaiveAttention = "capture"
) -> torch.Tensor:
    """Predicted importance from one forward over ``[prompt; lookahead]`` with the per-token LoRA mask.

    Args:
        prompt_ids: ``(1, S)``.
        attention: how the lookahead rows are read (module docstring).

    Returns:
        ``(1, layers, kv_heads, S)``, differentiable w.r.t. the embeddings and the LoRA weights.
    """
    if not isinstance(adapter.model, PeftModel):
        raise ValueError("the naive step compares LoRA masking; this lookahead module has no LoRA")
    if attention not in ("capture", "eager"):
        raise ValueError(f"attention must be 'capture' or 'eager', got {attention!r}")
    base = adapter.model.get_base_model()
    prompt_len, num_tokens = prompt_ids.shape[1], adapter.config.num_tokens
    embeds = base.get_input_embeddings()(prompt_ids)
    embeds = torch.cat([embeds, adapter.embeddings.to(embeds.dtype)[None]], dim=1)
    positions = torch.arange(prompt_len + num_tokens, device=embeds.device)[None]
    mask = (positions >= prompt_len)[..., None]
    # The adapter is enabled as LookaheadAdapter.predict does; the mask restricts it to the lookahead tokens.
    adapter._set_adapter(True)
    try:
        with masked_lora(adapter.model, mask):
            if attention == "eager":
                return _eager_lookahead_rows(base, embeds, positions, prompt_len)
            capture = ImportanceCapture(num_keys=prompt_len, last_queries=num_tokens)
            base.get_decoder()(
                inputs_embeds=embeds, position_ids=positions, use_cache=False, lkv_capture=capture
            )
            return capture.scores(base.config.num_hidden_layers)
    finally:
        adapter._set_adapter(False)


def _eager_lookahead_rows(
    base: PreTrainedModel, embeds: torch.Tensor, positions: torch.Tensor, prompt_len: int
) -> torch.Tensor:
    """Eager forward with ``output_attentions``; the rows of queries ``S:`` on keys ``:S`` per KV head.

    Args:
        embeds: ``(1, S+M, hidden)``; positions: ``(1, S+M)``.

    Returns:
        ``(1, layers, kv_heads, S)``, renormalised over the prompt keys.
    """
    implementation = base.config._attn_implementation
    base.set_attn_implementation("eager")
    try:
        maps = base.get_decoder()(
            inputs_embeds=embeds, position_ids=positions, use_cache=False, output_attentions=True
        ).attentions
    finally:
        base.set_attn_implementation(implementation)
    kv_heads = base.config.num_key_value_heads
    # (1, H, S+M, S+M) per layer → lookahead rows on prompt keys → (1, kv_heads, group·M, S) → mean
    rows = torch.stack([m[:, :, prompt_len:, :prompt_len] for m in maps], dim=1).float()
    mass = rows.unflatten(2, (kv_heads, -1)).flatten(3, 4).mean(dim=3)
    return mass / mass.sum(dim=-1, keepdim=True)


def naive_loss(
    adapter: LookaheadAdapter,
    prompt_ids: torch.Tensor,
    target: torch.Tensor,
    attention: NaiveAttention = "capture",
) -> torch.Tensor:
    """Training loss of the naive step: mean KL(target ‖ prediction) over (layer, KV head); ``target (L, H, S)``."""
    return importance_kl(target.float(), naive_importance(adapter, prompt_ids, attention)[0]).mean()
