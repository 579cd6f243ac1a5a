"""Ground-truth importance: the model's own response and the attention it pays to the prompt (`lkv label`).

Per prompt there is exactly one prefill. The response is decoded greedily from that cache; the cache is
then cropped back to the prompt and the response is teacher-forced once on top of it with an
:class:`~lkv.attention.ImportanceCapture`, which reduces the response rows on the fly. No ``S × S``
matrix, no LM head over the prompt, no second prefill.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel

from lkv import __version__
from lkv.attention import ImportanceCapture
from lkv.data.shards import LabelMeta, ShardWriter, finished_ids
from lkv.generation import crop_to, decode, eos_ids, prefill


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
    capture = ImportanceCapture(num_keys=prompt_len)
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


@dataclass
class LabelStats:
    """Outcome of a label run."""

    labelled: int
    skipped_done: int
    skipped_long: int
    seconds: float


def label_prompts(
    model: PreTrainedModel,
    tokenizer,
    prompts: Iterable,
    output: str | Path,
    meta: LabelMeta,
    render,
    shard_size: int = 64,
    rank: int = 0,
    progress: bool = True,
) -> LabelStats:
    """Label every prompt not already in ``output``; resumable and atomic per shard.

    Args:
        prompts: iterable of :class:`lkv.data.prompts.Prompt`.
        render: ``Prompt -> list[int] | None`` (None = skipped by the truncation policy).
    """
    writer = ShardWriter(output, meta, shard_size=shard_size, rank=rank)
    done = finished_ids(output)
    eos = eos_ids(model, tokenizer)
    stats = LabelStats(0, 0, 0, 0.0)
    start = time.perf_counter()
    for prompt in tqdm(prompts, desc="label", unit="prompt", disable=not progress):
        if prompt.id in done:
            stats.skipped_done += 1
            continue
        ids = render(prompt)
        if ids is None:
            stats.skipped_long += 1
            continue
        label = label_prompt(model, ids, meta.response_tokens, eos, meta.store_scores)
        writer.add(
            id=prompt.id,
            prompt_ids=ids,
            response_ids=label.response_ids,
            scores=label.scores,
            source=prompt.source,
            kind=prompt.kind,
            doc_id=prompt.doc_id,
        )
        stats.labelled += 1
    writer.flush()
    stats.seconds = time.perf_counter() - start
    return stats


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
