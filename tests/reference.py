"""Slow, independent references the fast paths are tested against."""

import torch


def eager_attentions(model, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per layer ``(batch, heads, Q, K)`` softmax attention of a plain eager forward over ``ids``."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(impl)


def eager_reference(model, ids: torch.Tensor, num_keys: int, first_query: int) -> torch.Tensor:
    """``(layers, kv_heads, S)`` from eager softmax rows of queries ``first_query:`` over the full sequence."""
    attentions = eager_attentions(model, ids)
    kv_heads = model.config.num_key_value_heads
    rows = []
    for att in attentions:
        batch, heads, q_len, _ = att.shape
        block = att[:, :, first_query:, :num_keys].reshape(batch, kv_heads, heads // kv_heads, -1, num_keys)
        mass = block.mean(dim=(2, 3))
        rows.append(mass / mass.sum(-1, keepdim=True))
    return torch.stack(rows, dim=1)[0]
