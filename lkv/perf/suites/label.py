"""``label``: ground-truth capture vs generate + forward; with ``--batch_sizes``, labelling throughput.

Pairwise: :func:`lkv.labels.labeller.label_prompt` (one prefill, greedy response, one teacher-forced pass
over the response only) vs ``model.generate`` + one teacher-forced forward over prompt + response: seconds
and peak memory, whose growth with the prompt length is fitted to a line.

Batch sizes (``--batch_sizes [1,4,8,16]``): every variant labels the same ``n`` prompts (seeded random token
ids whose lengths spread evenly over ``[(1 - spread) · S, S]``, so batches carry real padding) with
:func:`lkv.labels.batched.label_batch`, in the length-sorted batches ``lkv label --batch_size B`` forms:
prompts/s, speed-up over the smallest batch, padding and peak memory. Generations never stop early (no
EOS), so every variant does the same work.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.labels.batched import label_batch, length_batches
from lkv.labels.labeller import label_prompt
from lkv.perf.suites.base import MIB, BatchSizes, Measured, Suite, batch_size, fmt, ratio, timed
from lkv.perf.timing import Case, linear_fit
from lkv.perf.workbench import BenchSettings, Workbench

BATCHES = BatchSizes("prompts")


def spread_lengths(length: int, count: int, spread: float) -> list[int]:
    """``count`` prompt lengths evenly spaced from ``length`` down to ``(1 - spread) · length``."""
    if not 0 <= spread < 1:
        raise ValueError(f"label_length_spread must be in [0, 1), got {spread}")
    if count == 1:
        return [length]
    return [round(length * (1 - spread * i / (count - 1))) for i in range(count)]


def label_batches_case(
    model: PreTrainedModel, prompts: list[list[int]], size: int, response_tokens: int
) -> Case:
    """Label ``prompts`` in length-sorted batches of ``size``; ``info`` gives the padding fraction."""
    batches = length_batches(prompts, len, size)
    columns = sum(len(batch) * max(map(len, batch)) for batch in batches)
    padding = 1 - sum(map(len, prompts)) / columns

    @torch.no_grad()
    def run() -> None:
        for batch in batches:
            labels = label_batch(model, batch, response_tokens, eos_token_ids=[])
            assert all(len(label.response_ids) == response_tokens for label in labels)

    return Case(run=run, info={"prompts": len(prompts), "batch_size": size, "padding_fraction": padding})


class Label(Suite):
    name = "label"
    default_lengths = (1024, 2048, 4096)
    measures_memory = True

    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        return BATCHES.variants(settings) if settings.batch_sizes else ["label_prompt", "generate+forward"]

    def reference(self, settings: BenchSettings) -> str:
        return BATCHES.reference(settings) if settings.batch_sizes else "generate+forward"

    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        s, model = bench.settings, bench.model
        ids, tokens = bench.prompt(length), s.response_tokens
        if s.batch_sizes:
            count = s.label_prompts or max(s.batch_sizes)
            lengths = spread_lengths(length, count, s.label_length_spread)
            prompts = [bench.prompt(n)[0].tolist() for n in lengths]
            return label_batches_case(model, prompts, batch_size(variant), tokens)
        if variant == "label_prompt":

            def run() -> None:
                label = label_prompt(model, ids[0].tolist(), tokens, eos_token_ids=[])
                assert len(label.response_ids) == tokens and label.scores is not None

            return Case(run=run)

        @torch.no_grad()
        def generate_and_forward() -> None:
            out = model.generate(
                ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
            )
            assert out.shape[1] == length + tokens
            model(input_ids=out, logits_to_keep=1)

        return Case(run=generate_and_forward)

    def memory_settings(self, settings: dict[str, Any], variant: str) -> dict[str, Any]:
        if not settings["batch_sizes"]:
            return settings
        # one batch: batches run one after another and free their caches, so one batch's peak is the run's
        # (and a fresh subprocess need not label every prompt twice)
        return {**settings, "label_prompts": batch_size(variant)}

    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        if settings.batch_sizes:
            return BATCHES.derive(settings, measured)
        if timed(measured["label_prompt"], measured["generate+forward"]):
            return {"ratio": measured["label_prompt"]["median_s"] / measured["generate+forward"]["median_s"]}
        return {}

    def derive_across(self, settings: BenchSettings, lengths: dict[int, Measured]) -> dict[str, Any]:
        """Per variant, a line fit of peak memory against the prompt length (with ≥ 2 lengths)."""
        fits = {}
        for variant in self.variants(settings):
            points = [(n, v[variant]["peak_bytes"]) for n, v in lengths.items() if "peak_bytes" in v[variant]]
            if len(points) >= 2:
                fits[f"{variant}_peak_vs_length"] = linear_fit(*zip(*points, strict=True))
        return fits

    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        if result["settings"]["batch_sizes"]:
            head = ["S", "batch", "prompts", "padding %", "s", "prompts/s", "speed-up", "peak MiB"]
            return head, BATCHES.rows(
                result,
                lambda entry, figures: [
                    entry["batch_size"],
                    entry["prompts"],
                    fmt(100 * entry["padding_fraction"], digits=1),
                    fmt(entry["median_s"], digits=1),
                    fmt(figures.get("prompts_per_s"), digits=3),
                    ratio(figures.get("speedup")),
                    fmt(entry.get("peak_bytes"), MIB, 0),
                ],
            )
        rows = []
        head = ["S", "label_prompt s", "generate + forward s", "ratio", "label_prompt peak MiB"]
        head.append("baseline peak MiB")
        for length, measured in result["lengths"].items():
            ours, baseline = measured["label_prompt"], measured["generate+forward"]
            rows.append(
                [
                    length,
                    fmt(ours.get("median_s")),
                    fmt(baseline.get("median_s")),
                    fmt(result["derived"][length].get("ratio"), digits=3),
                    fmt(ours.get("peak_bytes"), MIB, 0),
                    fmt(baseline.get("peak_bytes"), MIB, 0),
                ]
            )
        return head, rows
