"""Ground-truth importance: the model's own response and the attention it pays to the prompt (`lkv label`).

Per prompt there is exactly one prefill. The response is decoded greedily from that cache; the cache is
then cropped back to the prompt and the response is teacher-forced once on top of it with an
:class:`~lkv.core.attention.ImportanceCapture`, which reduces the response rows on the fly. No ``S × S``
matrix, no LM head over the prompt, no second prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv import __version__
from lkv.core.attention import ImportanceCapture
from lkv.core.generation import crop_to, decode, prefill
from lkv.labels.shards import LabelMeta


@torch.no_grad()
def response_importance(
    model: PreTrainedModel, cache: DynamicCache, prompt_len: int, response_ids: torch.Tensor
) -> torch.Tensor:
    """s_GT of DESIGN §1 for a response teacher-forced on top of a prompt cache.

    Args:
        cache: the prompt's cache, exactly ``prompt_len`` entries long; restored to that length on return.
        response_ids: ``(1, R)`` response tokens.

    Returns:
        ``(layers, kv_heads, prompt_len)`` fp32; each ``[l, h]`` row sums to 1.
    """
    if cache.get_seq_length() != prompt_len:
        raise ValueError(f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}")
    # every response query is captured, so the capture's fp32 rows also give the attention output
    capture = ImportanceCapture(num_keys=prompt_len, computes_output=True)
    model(input_ids=response_ids, cache=cache, use_cache=True, logits_to_keep=1, lkv_capture=capture)
    crop_to(cache, prompt_len)
    return capture.scores(model.config.num_hidden_layers)[0]


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
) -> LabelMeta:
    """Metadata of a label run (the current lkv version filled in)."""
    return LabelMeta(
        model=signature,
        response_tokens=response_tokens,
        max_prompt_tokens=max_prompt_tokens,
        truncation=truncation,
        score_dtype=score_dtype,
        store_scores=store_scores,
        prompt_source=prompt_source,
        lkv_version=__version__,
    )
