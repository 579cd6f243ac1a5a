"""Expected Attention (Devoto, Jeblick and Jégou, 2025, "Expected Attention: KV Cache Compression by Estimating
Attention from Future Queries Distribution"; NVIDIA kvpress's ``ExpectedAttentionPress``).

Future queries are unknown at prefill time, but their distribution is not: a layer's queries before RoPE are
modelled as a Gaussian ``N(μ, Σ)`` fitted to the prompt's own queries, and the rotation RoPE applies to a
future query is averaged over the next ``n_future_positions`` positions (``R̄``). For a Gaussian query the
expected unnormalised attention on key ``k`` has a closed form, ``E[exp(qᵀk/√d)] = exp(kᵀR̄μ/√d +
kᵀR̄ΣR̄ᵀk / 2d)``; its softmax over the prompt, averaged over the query heads of a KV group and weighted by the
value's norm (what the entry adds to the residual stream), is the score.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import AttentionCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext


def prerope_queries(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``(batch, heads, Q, head_dim)`` queries of attention ``module`` before RoPE, from its input hidden states
    ``(batch, Q, hidden)`` (Llama-like ``q_proj``; Qwen3's ``q_norm`` too)."""
    if not hasattr(module, "q_proj"):
        raise NotImplementedError(f"{type(module).__name__} has no q_proj: cannot compute its queries")
    queries = module.q_proj(hidden_states).view(*hidden_states.shape[:2], -1, module.head_dim)
    if hasattr(module, "q_norm"):
        queries = module.q_norm(queries)
    return queries.transpose(1, 2)


class QueryStatistics(AttentionCapture):
    """Mean and covariance of each layer's queries before RoPE over the last ``last_queries`` prompt tokens.

    Filled from the attention modules' input hidden states during the prompt's prefill (one forward pass).
    """

    def __init__(self, num_keys: int, last_queries: int) -> None:
        super().__init__(num_keys, last_queries)
        self._stats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def observe_input(self, module: nn.Module, hidden_states: torch.Tensor) -> None:
        if module.layer_idx in self._stats:
            raise RuntimeError(
                f"layer {module.layer_idx} was observed twice: query statistics need the prompt in one forward pass"
            )
        queries = prerope_queries(module, hidden_states[:, -self.last_queries :]).float()
        mean = queries.mean(dim=2, keepdim=True)
        centred = queries - mean
        covariance = centred.transpose(2, 3) @ centred / queries.shape[2]
        self._stats[module.layer_idx] = (mean[:, :, 0], covariance)

    def take(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean (batch, heads, d), covariance (batch, heads, d, d))`` of layer ``layer_idx``, then dropped."""
        if layer_idx not in self._stats:
            raise RuntimeError(
                f"no query statistics for layer {layer_idx}: was the model prepared with "
                "lkv.core.attention.install_capture() and the prefill given this capture?"
            )
        return self._stats.pop(layer_idx)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of the two halves of the last dimension: ``(x1, x2) → (−x2, x1)``."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def average_rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``R̄ (d, d)``, the mean over positions of RoPE's rotation matrices: ``R̄ q`` is the mean of ``q`` rotated to
    each position.

    Args:
        cos, sin: ``(positions, d)`` the rotary embedding of those positions.
    """
    cos, sin = cos.float().mean(dim=0), sin.float().mean(dim=0)
    eye = torch.eye(cos.shape[-1], device=cos.device)
    return (cos * eye + sin * rotate_half(eye)).T  # row j of the sum is R̄ applied to the j-th unit vector


def expected_attention_scores(
    mean: torch.Tensor,
    covariance: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rotation: torch.Tensor,
    use_covariance: bool = True,
    use_vnorm: bool = True,
    epsilon: float = 0.0,
) -> torch.Tensor:
    """Expected attention of a layer's future queries on its keys, per KV head.

    Args:
        mean, covariance: ``(1, heads, d)`` and ``(1, heads, d, d)`` statistics of the queries before RoPE.
        keys, values: ``(1, kv_heads, n, d)`` the entries to score (after RoPE, as cached).
        rotation: ``R̄ (d, d)`` (:func:`average_rotation`).
        use_covariance: add the covariance term (else the mean query alone).
        use_vnorm: weight by the value norm, ``(score + epsilon) · ‖v‖``.

    Returns:
        ``(1, kv_heads, n)`` float32.
    """
    kv_heads, head_dim = keys.shape[1], keys.shape[3]
    group = mean.shape[1] // kv_heads
    keys = keys.float().repeat_interleave(group, dim=1)  # (1, heads, n, d)
    mean = mean @ rotation.T
    logits = keys @ mean[..., None] / math.sqrt(head_dim)
    if use_covariance:
        covariance = rotation @ covariance @ rotation.T
        logits = logits + ((keys @ covariance) * keys).sum(dim=-1, keepdim=True) / (2 * head_dim)
    probs = torch.softmax(logits[..., 0], dim=-1)
    scores = probs.view(1, kv_heads, group, -1).mean(dim=2)
    if use_vnorm:
        scores = (scores + epsilon) * values.float().norm(dim=-1)
    return scores


class ExpectedAttentionPress(Press):
    """Expected Attention; the defaults are kvpress's (the paper's): 512 future positions, 4 sinks, covariance
    and value-norm weighting on, ``epsilon`` 0.

    The query statistics skip the first ``n_sink`` prompt tokens (their hidden states are outliers); those
    tokens are always kept (:meth:`protected`) and the softmax runs over the other keys. Layer ``l``'s scores
    need layer ``l``'s queries, keys and values only, so the press streams.

    Args:
        n_future_positions: future positions the RoPE rotation is averaged over.
        n_sink: leading tokens always kept and left out of the statistics.
        use_covariance: include the covariance term of the expected attention.
        use_vnorm: weight scores by the value norm.
        epsilon: added to the attention before the value-norm weighting.
    """

    name = "expected_attention"
    streamable = True

    def __init__(
        self,
        n_future_positions: int = 512,
        n_sink: int = 4,
        use_covariance: bool = True,
        use_vnorm: bool = True,
        epsilon: float = 0.0,
    ) -> None:
        if n_future_positions <= 0:
            raise ValueError(f"n_future_positions must be positive, got {n_future_positions}")
        if n_sink < 0:
            raise ValueError(f"n_sink must be ≥ 0, got {n_sink}")
        if epsilon < 0:
            raise ValueError(f"epsilon must be ≥ 0, got {epsilon}")
        self.n_future_positions = n_future_positions
        self.n_sink = n_sink
        self.use_covariance = use_covariance
        self.use_vnorm = use_vnorm
        self.epsilon = epsilon

    def prefill_capture(self, prompt_len: int) -> QueryStatistics:
        if prompt_len <= self.n_sink:
            raise ValueError(
                f"expected_attention needs a prompt longer than its n_sink={self.n_sink} tokens, got {prompt_len}"
            )
        return QueryStatistics(num_keys=prompt_len, last_queries=prompt_len - self.n_sink)

    def score(self, ctx: PressContext) -> torch.Tensor:
        scorer = self._scorer(ctx.model, ctx.capture, ctx.cache, ctx.prompt_len)
        return torch.stack([scorer(layer) for layer in range(len(ctx.cache.layers))], dim=1)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return self._scorer(ctx.model, ctx.capture, ctx.cache, ctx.prompt_len)

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return min(self.n_sink, prompt_len), 0

    def _scorer(
        self, model: PreTrainedModel, capture: QueryStatistics, cache: DynamicCache, prompt_len: int
    ) -> LayerScorer:
        """``layer → (1, kv_heads, S)`` scores, ``+inf`` on the sinks."""
        decoder = model.get_decoder()
        if not hasattr(decoder, "rotary_emb"):
            raise NotImplementedError(f"{type(decoder).__name__} has no shared rotary embedding")
        device = next(model.parameters()).device
        positions = torch.arange(prompt_len, prompt_len + self.n_future_positions, device=device)[None]
        probe = torch.zeros(1, device=device, dtype=torch.float32)
        cos, sin = decoder.rotary_emb(probe, position_ids=positions)
        rotation = average_rotation(cos[0], sin[0])

        def layer_scores(layer_idx: int) -> torch.Tensor:
            mean, covariance = capture.take(layer_idx)
            layer = cache.layers[layer_idx]
            scores = expected_attention_scores(
                mean,
                covariance,
                layer.keys[:, :, self.n_sink :],
                layer.values[:, :, self.n_sink :],
                rotation.to(mean.device),
                self.use_covariance,
                self.use_vnorm,
                self.epsilon,
            )
            sinks = scores.new_full((*scores.shape[:2], self.n_sink), float("inf"))
            return torch.cat([sinks, scores], dim=-1)

        return layer_scores
