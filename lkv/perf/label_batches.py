"""Labelling throughput at several batch sizes (``lkv bench --which label --batch_sizes [1,4,8,16]``).

Every variant labels the same ``n`` prompts (seeded random token ids whose lengths spread evenly over
``[(1 - spread) · S, S]``, so batches carry real padding) with :func:`lkv.labels.batched.label_batch`, in
the length-sorted batches ``lkv label --batch_size B`` forms. Generations never stop early (no EOS), so every
variant does the same work; prompts/s is ``n`` over the run's seconds.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from lkv.core.timing import Case
from lkv.labels.batched import label_batch, length_batches


def spread_lengths(length: int, count: int, spread: float) -> list[int]:
    """``count`` prompt lengths evenly spaced from ``length`` down to ``(1 - spread) · length``."""
    if not 0 <= spread < 1:
        raise ValueError(f"label_length_spread must be in [0, 1), got {spread}")
    if count == 1:
        return [length]
    return [round(length * (1 - spread * i / (count - 1))) for i in range(count)]


def label_batches_case(
    model: PreTrainedModel, prompts: list[list[int]], batch_size: int, response_tokens: int
) -> Case:
    """Label ``prompts`` in length-sorted batches of ``batch_size``; ``info`` gives the padding fraction."""
    batches = length_batches(prompts, len, batch_size)
    columns = sum(len(batch) * max(map(len, batch)) for batch in batches)
    padding = 1 - sum(map(len, prompts)) / columns

    @torch.no_grad()
    def run() -> None:
        for batch in batches:
            labels = label_batch(model, batch, response_tokens, eos_token_ids=[])
            assert all(len(label.response_ids) == response_tokens for label in labels)

    return Case(
        run=run, info={"prompts": len(prompts), "batch_size": batch_size, "padding_fraction": padding}
    )
