"""Ground-truth importance: the model's own response and the attention it pays to the prompt (`lkv label`).

Per prompt there is exactly one prefill. The response is decoded greedily from that cache; the cache is
then cropped back to the prompt and the response is teacher-forced once on top of it with an
:class:`~lkv.core.attention.ImportanceCapture`, which reduces the response rows on the fly. No ``S × S``
matrix, no LM head over the prompt, no second prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from lkv import __version__
from lkv.core.generation import crop_to, decode, prefill
from lkv.core.importance import response_importance
from lkv.labels.shards import LabelMeta


@dataclass
class Label:
    """One labelled prompt: response ``(R,)`` and scores ``(layers, kv_heads, S)`` (None if not kept)."""

    response_ids: list[int]
    scores: torch.Tensor | None


@torch.no_grad()
def label_prompt(
    model: PreTrainedModel,
    prompt_ids: list[int],
    response_tokens: int,
    eos_token_ids: list[int],
    store_scores: bool = True,
) -> Label:
    """Greedy response (≤ ``response_tokens``) and its ground-truth importance over the prompt."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    cache, logits = prefill(model, ids)
    response = decode(model, cache, logits, len(prompt_ids), response_tokens, eos_token_ids)
    if not store_scores:
        return Label(response, None)
    crop_to(cache, len(prompt_ids))
    scores = response_importance(model, cache, len(prompt_ids), torch.tensor([response], device=device))
    return Label(response, scores)


def make_meta(
    signature: dict,
    response_tokens: int,
    max_prompt_tokens: int,
    truncation: str,
    score_dtype: str,
    store_scores: bool,
    prompt_source: str,
    extra: dict | None = None,
) -> LabelMeta:
    """Metadata of a label run (the current lkv version filled in); ``extra`` goes to ``LabelMeta.extra``."""
    return LabelMeta(
        model=signature,
        response_tokens=response_tokens,
        max_prompt_tokens=max_prompt_tokens,
        truncation=truncation,
        score_dtype=score_dtype,
        store_scores=store_scores,
        prompt_source=prompt_source,
        lkv_version=__version__,
        extra=dict(extra or {}),
    )
