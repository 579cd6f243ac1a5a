"""Importance quality: how well each method's scores rank a label folder's ground-truth importance
(Recall@C, Kendall τ; :class:`~lkv.eval.tasks.ImportanceTask`)."""

from __future__ import annotations

import torch

from lkv.core.importance import response_importance
from lkv.core.progress import Progress
from lkv.eval.prefill import shared_prefill, with_protected
from lkv.eval.results import NO_BUDGET, ResultRow
from lkv.eval.setup import EvalSetup
from lkv.eval.tasks import ImportanceTask
from lkv.eviction.roles import roles_of
from lkv.model.backbone import model_signature


def run_importance(setup: EvalSetup, task: ImportanceTask) -> None:
    """Per label one shared prefill; each method's scores ranked against the label's (one row per method,
    budget :data:`~lkv.eval.results.NO_BUDGET`: the row carries every Recall@C)."""
    task.check_model(model_signature(setup.model, setup.tokenizer, "evaluated model"))
    methods = [m for m in setup.methods if not roles_of(m).unranked]
    labels = setup.shard.of(
        task.samples(setup.tokenizer)
    )  # lazily: each holds a (layers, kv_heads, S) target
    bar = Progress(f"lkv eval: {task.name}", setup.shard.size(len(task)), "prompts", setup.progress)
    for label in bar.track(labels):
        todo = [
            m
            for m in methods
            if (task.name, label.id, m, NO_BUDGET, task.fixed_setting) not in setup.results.done
        ]
        if not todo:
            continue
        ids = torch.tensor([label.prompt_ids], device=setup.full.device)
        presses = {m: setup.compressors[m].press for m in todo}
        shared = shared_prefill(setup.model, ids, presses)
        # the metrics are computed on the device that holds the scores (the model's)
        if label.target is None:  # a responses-only folder: the ground truth from this same prefill
            response = torch.tensor([label.response_ids], device=setup.full.device)
            target = response_importance(setup.model, shared.cache, shared.prompt_len, response)
        else:
            target = label.target.to(setup.full.device)
        for method in todo:
            scores, seconds = setup.press_scores(method, shared)
            metrics = task.score(with_protected(scores[0], presses[method]), target)
            setup.results.add(
                ResultRow(
                    task=task.name,
                    sample=label.id,
                    method=method,
                    budget=NO_BUDGET,
                    setting=task.fixed_setting,
                    score=metrics[task.metric],
                    metrics=metrics,
                    prompt_tokens=len(label.prompt_ids),
                    prefill_s=shared.seconds,
                    score_s=seconds,
                    meta={},
                )
            )
