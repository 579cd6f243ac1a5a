"""Ground-truth labels for several prompts at once (``lkv label --batch_size B``, ``--responses``).

Batching pays off in the greedy decode, where a batch-1 step leaves the device idle: the prompts are
prefilled one by one, stacked into one left-padded cache and decoded together
(:func:`lkv.core.batched_generation.greedy_batch`). When a row stops, its own prompt cache is cut out of the
stacked one (bit for bit the cache a batch-1 prefill gives) and its response is teacher-forced on it at once
(:func:`lkv.core.importance.response_importance`): per prompt, because that pass already runs ``R`` query tokens
in one forward, and because it keeps only one prompt's fp32 score sums alive at a time.

Prompts of similar length go together: :func:`length_batches` sorts them so the padding stays small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from transformers import PreTrainedModel

from lkv.core.batched_generation import greedy_batch, prefill_padded
from lkv.core.generation import prefill
from lkv.core.importance import response_importance
from lkv.labels.labeller import Label, label_prompt

T = TypeVar("T")


def length_batches(items: Sequence[T], length: Callable[[T], int], batch_size: int) -> list[list[T]]:
    """``items`` in batches of ``batch_size`` of similar ``length``, the longest batch first.

    Sorting by length keeps a batch's padding to the spread of lengths among neighbours; the longest batch
    comes first so that a batch too large for the device fails at once, not hours into a run.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ordered = sorted(items, key=length, reverse=True)
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


@torch.no_grad()
def label_batch(
    model: PreTrainedModel,
    prompts: Sequence[list[int]],
    response_tokens: int,
    eos_token_ids: list[int],
    store_scores: bool = True,
) -> list[Label]:
    """:func:`~lkv.labels.labeller.label_prompt` for several prompts, decoded together (one batch).

    A single prompt takes :func:`~lkv.labels.labeller.label_prompt` itself.

    Returns:
        One :class:`~lkv.labels.labeller.Label` per prompt, in the given order; scores ``(layers, kv_heads, S_b)``.
    """
    if len(prompts) == 1:
        return [label_prompt(model, prompts[0], response_tokens, eos_token_ids, store_scores)]
    padded = prefill_padded(model, prompts)
    labels: list[Label | None] = [None] * len(prompts)
    # a finished row's prompt cache is cut out of the batch (a copy) only to teacher-force its response
    for done in greedy_batch(model, padded, response_tokens, eos_token_ids, keep_prompt=store_scores):
        scores = None
        if store_scores:
            device = next(model.parameters()).device
            response = torch.tensor([done.tokens], device=device)
            scores = response_importance(model, done.prompt_cache, len(prompts[done.row]), response)
            done.prompt_cache = None  # let the copy go before the batch decodes on
        labels[done.row] = Label(done.tokens, scores)
    return labels


@torch.no_grad()
def label_response(model: PreTrainedModel, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """Ground truth of a response produced elsewhere (vLLM, TGI, ...): one prefill + one teacher-forced pass.

    Returns:
        ``(layers, kv_heads, S)`` fp32, each row summing to 1.
    """
    if not response_ids:
        raise ValueError("the response is empty: there are no response queries to take the attention of")
    device = next(model.parameters()).device
    cache, _ = prefill(model, torch.tensor([prompt_ids], device=device))
    return response_importance(model, cache, len(prompt_ids), torch.tensor([response_ids], device=device))
