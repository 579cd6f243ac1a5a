"""KeyDiff (Park et al., 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments"): keep the keys least like the average key; no attention is needed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


def keydiff_scores(keys: torch.Tensor) -> torch.Tensor:
    """``keys (1, kv_heads, S, head_dim)`` → ``(1, kv_heads, S)``: minus the cosine similarity of each key to the
    anchor, the mean of the head's unit-normalised keys (a key unlike the rest scores high)."""
    keys = keys.float()
    anchor = F.normalize(keys, dim=-1).mean(dim=2, keepdim=True)
    return -F.cosine_similarity(keys, anchor, dim=-1)


class KeyDiffPress(Press):
    """Scores each prompt key of a layer by its dissimilarity to the layer's mean key direction, per KV head.

    One scoring of the whole prompt, as NVIDIA kvpress's ``KeyDiffPress`` does; the paper evicts block by block
    while the prompt streams in (the anchor then covers the keys cached so far), which kvpress and lkv leave to
    a block-wise prefill. Layer ``l``'s scores need its keys only, so it streams.
    """

    name = "keydiff"
    streamable = True

    def score(self, ctx: PressContext) -> torch.Tensor:
        return torch.stack([keydiff_scores(layer.keys) for layer in ctx.cache.layers], dim=1)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return lambda layer: keydiff_scores(ctx.cache.layers[layer].keys)
