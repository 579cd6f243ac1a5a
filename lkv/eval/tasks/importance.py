"""Importance quality on held-out label shards: Recall@C and Kendall τ of each method vs s_GT (paper Table 8).

Every method scores the label's prompt from one shared prefill; its scores, with the positions the method
always keeps (SnapKV's window, StreamingLLM's sink, H2O's recent tokens) raised to ``+inf``, are ranked
against the ground truth per (layer, KV head) and averaged over rows and samples. A responses-only folder
(``lkv label --store_scores false``) carries no ground truth: the runner computes it from the stored
response, teacher-forced on that same prefill (as training does).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lkv.core.budget import token_budgets
from lkv.eval.tasks.base import Benchmark

if (
    TYPE_CHECKING
):  # torch and the shards' readers load at run time, so `lkv eval --help` lists this task at once
    import torch
    from transformers import PreTrainedTokenizerBase

    from lkv.eval.prompt_settings import Setting
    from lkv.model.backbone import ModelSignature


@dataclass
class LabelSample:
    """One held-out label: ``prompt_ids (S,)``, the model's ``response_ids (R,)`` and the ground truth
    ``target (layers, kv_heads, S)`` — None for a responses-only folder (computed online from the response)."""

    id: str
    prompt_ids: list[int]
    response_ids: list[int]
    target: torch.Tensor | None


class ImportanceTask(Benchmark):
    """Ranking quality of every method's scores against a held-out label folder written by ``lkv label``.

    Args:
        folder: label folder of held-out prompts, with stored scores or responses only.
        budgets: the C of Recall@C.
        max_samples: use only the first this many labels (None: all).
    """

    name = "importance"
    fixed_setting: Setting | None = "aware"

    def __init__(
        self, folder: str, budgets: tuple[int, ...] = (64, 128), max_samples: int | None = None
    ) -> None:
        self.folder = folder
        self.budgets = token_budgets(budgets, "ImportanceTask.budgets")
        self.max_samples = max_samples
        self.metric = f"recall@{self.budgets[0]}"

    def check_model(self, signature: ModelSignature) -> None:
        """Refuse labels made with another model or tokenizer (their scores would not describe this one)."""
        from lkv.labels.shards import read_meta
        from lkv.model.backbone import ModelSignature, check_compatible

        meta = read_meta(self.folder)
        check_compatible(ModelSignature.from_dict(meta.model), signature, f"label folder {self.folder}")

    def __len__(self) -> int:
        """Labels that :meth:`samples` yields (counted from the shard footers)."""
        from lkv.labels.shards import shard_rows

        rows = sum(count for _, count in shard_rows(self.folder))
        return rows if self.max_samples is None else min(rows, self.max_samples)

    def samples(self, tokenizer: PreTrainedTokenizerBase | None = None) -> Iterator[LabelSample]:
        """The labels, read lazily (the prompts are already token ids, so no tokenizer is needed)."""
        from lkv.labels.shards import load_labels, read_meta, row_scores

        meta = read_meta(self.folder)
        for index, row in enumerate(load_labels(self.folder)):
            if self.max_samples is not None and index >= self.max_samples:
                return
            target = row_scores(row, meta, self.folder) if meta.store_scores else None
            yield LabelSample(row["id"], list(row["prompt_ids"]), list(row["response_ids"]), target)

    def score(self, scores: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """Recall@C for each budget and Kendall τ-b, averaged over (layer, KV head) rows.

        Computed where ``scores`` are (``target`` is moved there), with the metrics validation uses in training
        (:func:`lkv.core.metrics.ranking_metrics`): on a GPU, 32 layers × 8 heads × 16K positions take
        milliseconds instead of the CPU's ~10 s per method.

        Args:
            scores: ``(layers, kv_heads, S)`` a method's ranking (any monotone scale, ``+inf`` = always kept).
            target: ``(layers, kv_heads, S)`` ground truth.
        """
        from lkv.core.metrics import ranking_metrics

        if scores.shape != target.shape:
            raise ValueError(f"scores {tuple(scores.shape)} and target {tuple(target.shape)} differ in shape")
        metrics = ranking_metrics(list(self.budgets), prefix="", kl=False).to(scores.device)
        metrics.update(scores, target.to(scores.device))
        return {name: value.item() for name, value in metrics.compute().items()}
