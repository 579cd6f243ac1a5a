"""The naive training step that ``lkv bench --which train-step`` measures the two-phase step against.

One full-sequence forward + backward over ``[prompt; lookahead]`` with the LoRA applied at every position
and zeroed outside the lookahead tokens by a per-token mask (the "selective LoRA" of the guides): forward
hooks on peft's ``lora_B`` modules multiply their output by a ``(batch, seq, 1)`` mask. The prompt's
activations are then kept for backward and its positions run through the LoRA branch, although neither can
change the loss — exactly the work the two-phase step of :mod:`lkv.module` avoids. Both compute the same
loss and gradients (tests/test_bench.py checks it), so the comparison is like for like.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

from lkv.attention import ImportanceCapture
from lkv.lookahead import LookaheadAdapter
from lkv.metrics import importance_kl


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


def naive_importance(adapter: LookaheadAdapter, prompt_ids: torch.Tensor) -> torch.Tensor:
    """Predicted importance from one forward over ``[prompt; lookahead]`` with the per-token LoRA mask.

    Args:
        prompt_ids: ``(1, S)``.

    Returns:
        ``(1, layers, kv_heads, S)``, differentiable w.r.t. the embeddings and the LoRA weights.
    """
    if not isinstance(adapter.model, PeftModel):
        raise ValueError("the naive step compares LoRA masking; this lookahead module has no LoRA")
    base = adapter.model.get_base_model()
    prompt_len, num_tokens = prompt_ids.shape[1], adapter.config.num_tokens
    embeds = base.get_input_embeddings()(prompt_ids)
    embeds = torch.cat([embeds, adapter.embeddings.to(embeds.dtype)[None]], dim=1)
    positions = torch.arange(prompt_len + num_tokens, device=embeds.device)[None]
    mask = (positions >= prompt_len)[..., None]
    capture = ImportanceCapture(num_keys=prompt_len, last_queries=num_tokens)
    # The adapter is enabled as LookaheadAdapter.predict does; the mask restricts it to the lookahead tokens.
    adapter._set_adapter(True)
    try:
        with masked_lora(adapter.model, mask):
            base.get_decoder()(
                inputs_embeds=embeds, position_ids=positions, use_cache=False, lkv_capture=capture
            )
    finally:
        adapter._set_adapter(False)
    return capture.scores(base.config.num_hidden_layers)


def naive_loss(adapter: LookaheadAdapter, prompt_ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Training loss of the naive step: mean KL(target ‖ prediction) over (layer, KV head); ``target (L, H, S)``."""
    return importance_kl(target.float(), naive_importance(adapter, prompt_ids)[0]).mean()
