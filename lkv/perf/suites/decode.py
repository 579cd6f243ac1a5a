"""``decode``: seconds per decoded token and K/V bytes, full cache vs SnapKV-compressed; with
``--batch_sizes``, compressed answers decoded ``B`` at a time as ``lkv eval --batch_size B`` does.

Batch sizes: every variant decodes the same ``n`` answers: ``n`` seeded random prompts of one length, each
compressed by SnapKV to the budget (so every cache holds ``budget`` entries per head, as in an eval batch of
one budget), decoded ``decode_tokens`` tokens each in batches of ``B``
(:func:`lkv.core.batched_generation.stack_caches` + :func:`~lkv.core.batched_generation.greedy_batch`,
positions continuing from the uncompressed length). No EOS stops a row, so tokens/s is
``n · decode_tokens`` over the run's seconds.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.core.batched_generation import greedy_batch, stack_caches
from lkv.core.cache import cache_bytes
from lkv.core.generation import decode, prefill
from lkv.eviction.compressor import Compressor
from lkv.eviction.records import CompressedPrompt
from lkv.perf.suites.base import MIB, BatchSizes, Measured, Suite, batch_size, fmt, ratio, timed
from lkv.perf.timing import Case
from lkv.perf.workbench import BenchSettings, Workbench

BATCHES = BatchSizes("tokens")


def decode_batches_case(
    model: PreTrainedModel, prompts: list[CompressedPrompt], size: int, steps: int
) -> Case:
    """Decode ``steps`` tokens from each of ``prompts`` in batches of ``size`` (the caches are copied into
    each batch, so every run starts from the same caches); ``info`` gives the tokens decoded."""

    @torch.no_grad()
    def run() -> None:
        for start in range(0, len(prompts), size):
            batch = prompts[start : start + size]
            padded = stack_caches(
                [p.cache for p in batch], [p.next_logits for p in batch], [p.prompt_len for p in batch]
            )
            done = list(greedy_batch(model, padded, steps, keep_prompt=False))
            assert all(len(row.tokens) == steps for row in done)

    return Case(run=run, info={"answers": len(prompts), "batch_size": size, "tokens": len(prompts) * steps})


class Decode(Suite):
    name = "decode"
    default_lengths = (1024, 2048, 4096)

    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        return BATCHES.variants(settings) if settings.batch_sizes else ["full", "compressed"]

    def reference(self, settings: BenchSettings) -> str:
        return BATCHES.reference(settings) if settings.batch_sizes else "full"

    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        s = bench.settings
        if variant != "full" and s.budget >= length:
            raise ValueError(f"decode: budget {s.budget} must be below the prompt length {length}")
        if s.batch_sizes:
            return decode_batches_case(
                bench.model, self._answers(bench, length), batch_size(variant), s.decode_tokens
            )
        ids = bench.prompt(length)
        if variant == "full":
            source, logits = prefill(bench.model, ids)
        else:
            compressed = Compressor(bench.model, None, bench.press("snapkv"), s.budget).compress(ids)
            source, logits = compressed.cache, compressed.next_logits
        state: dict[str, Any] = {}

        def reset() -> None:
            state["cache"] = copy.deepcopy(source)  # decoding grows the cache: every run starts afresh

        def run() -> None:
            # steps + 1 tokens = `steps` forward passes (the first token comes from the prefill's logits)
            decode(bench.model, state["cache"], logits, length, s.decode_tokens + 1)

        entries = sum(layer.get_seq_length() for layer in source.layers)
        return Case(run=run, reset=reset, info={"kv_bytes": cache_bytes(source), "kv_entries": entries})

    def _answers(self, bench: Workbench, length: int) -> list[CompressedPrompt]:
        """The SnapKV-compressed answers every batch size decodes, compressed once per length."""
        key = (self.name, length)
        if key not in bench.shared:
            s = bench.settings
            compressor = Compressor(bench.model, None, bench.press("snapkv"), s.budget)
            count = s.label_prompts or max(s.batch_sizes or [1])
            # distinct seeded prompts of one length (the i-th: the first `length` ids of prompt(length + i))
            bench.shared[key] = [
                compressor.compress(bench.prompt(length + i)[:, :length]) for i in range(count)
            ]
        return bench.shared[key]

    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        if settings.batch_sizes:
            return BATCHES.derive(settings, measured)
        full, compressed = measured["full"], measured["compressed"]
        if not timed(full, compressed):
            return {}
        steps = settings.decode_tokens
        derived = {
            "full_s_per_token": full["median_s"] / steps,
            "compressed_s_per_token": compressed["median_s"] / steps,
        }
        derived["speedup"] = derived["full_s_per_token"] / derived["compressed_s_per_token"]
        derived["kv_bytes_ratio"] = compressed["kv_bytes"] / full["kv_bytes"]
        derived["budget_over_length"] = settings.budget / length
        return derived

    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        if result["settings"]["batch_sizes"]:
            head = ["S", "batch", "answers", "tokens", "s", "tokens/s", "speed-up"]
            return head, BATCHES.rows(
                result,
                lambda entry, figures: [
                    entry["batch_size"],
                    entry["answers"],
                    entry["tokens"],
                    fmt(entry["median_s"], digits=2),
                    fmt(figures.get("tokens_per_s"), digits=2),
                    ratio(figures.get("speedup")),
                ],
            )
        rows = []
        head = ["S", "full ms/token", "compressed ms/token", "speed-up", "full KV MiB", "kept KV MiB"]
        head += ["kept/full", "budget/S"]
        for length, measured in result["lengths"].items():
            d = result["derived"][length]
            rows.append(
                [
                    length,
                    fmt(d.get("full_s_per_token"), 1e-3, 2),
                    fmt(d.get("compressed_s_per_token"), 1e-3, 2),
                    ratio(d.get("speedup")),
                    fmt(measured["full"].get("kv_bytes"), MIB, 2),
                    fmt(measured["compressed"].get("kv_bytes"), MIB, 2),
                    fmt(d.get("kv_bytes_ratio"), digits=4),
                    fmt(d.get("budget_over_length"), digits=4),
                ]
            )
        return head, rows
