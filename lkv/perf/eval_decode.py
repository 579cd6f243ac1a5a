"""Decoding compressed caches in batches, as ``lkv eval --batch_size B`` does (``lkv bench --which decode
--batch_sizes [1,4,8]``).

Every variant decodes the same ``n`` answers: ``n`` seeded random prompts of one length, each compressed by
SnapKV to the budget (so every cache holds ``budget`` entries per head, as in an eval batch of one budget),
decoded ``steps`` tokens each in batches of ``B`` (:func:`lkv.core.batched_generation.stack_caches` +
:func:`~lkv.core.batched_generation.greedy_batch`, positions continuing from the uncompressed length). No
EOS stops a row, so tokens/s is ``n · steps`` over the run's seconds.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from lkv.core.batched_generation import greedy_batch, stack_caches
from lkv.eviction.compressor import CompressedPrompt
from lkv.perf.timing import Case


def decode_batches_case(
    model: PreTrainedModel, prompts: list[CompressedPrompt], batch_size: int, steps: int
) -> Case:
    """Decode ``steps`` tokens from each of ``prompts`` in batches of ``batch_size`` (the caches are copied
    into each batch, so every run starts from the same caches); ``info`` gives the tokens decoded."""

    @torch.no_grad()
    def run() -> None:
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            padded = stack_caches(
                [p.cache for p in batch], [p.next_logits for p in batch], [p.prompt_len for p in batch]
            )
            done = list(greedy_batch(model, padded, steps, keep_prompt=False))
            assert all(len(row.tokens) == steps for row in done)

    return Case(
        run=run,
        info={"answers": len(prompts), "batch_size": batch_size, "tokens": len(prompts) * steps},
    )
