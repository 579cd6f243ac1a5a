"""Needle-token retention (prefill only): per budget, the share of a needle's value tokens each KV head keeps
(:class:`~lkv.eval.tasks.needle_tokens.NeedleTokenTask`)."""

from __future__ import annotations

import torch

from lkv.core.clock import clock
from lkv.core.generation import crop_to, decode
from lkv.core.importance import response_importance
from lkv.core.progress import Progress
from lkv.eval.prefill import shared_prefill
from lkv.eval.results import ResultRow, budget_key
from lkv.eval.setup import EvalSetup
from lkv.eval.tasks import encode_sample
from lkv.eval.tasks.needle_tokens import NeedleTokenTask, kept_share, share_metrics, value_positions
from lkv.eviction.roles import UPPER_BOUND, roles_of


def run_needle_tokens(setup: EvalSetup, task: NeedleTokenTask) -> None:
    """Per sample one prefill, every method's scores, and per budget the value tokens each head keeps."""
    # the upper bound has no ranking of its own to score, but it keeps needle tokens like any method
    methods = [m for m in setup.methods if not roles_of(m).unranked or roles_of(m).role == "upper bound"]
    samples = list(setup.shard.of(task.samples(setup.tokenizer)))
    for sample in Progress(f"lkv eval: {task.name}", len(samples), "prompts", setup.progress).track(samples):
        todo = [
            (m, b)
            for m in methods
            for b in setup.budgets
            if (task.name, sample.id, m, budget_key(b), task.fixed_setting) not in setup.results.done
        ]
        if not todo:
            continue
        context, question = encode_sample(sample, setup.tokenizer)
        positions = value_positions(sample, setup.tokenizer)
        ids = torch.tensor([context + question], device=setup.full.device)
        scored = {m: setup.compressors[m].press for m, _ in todo if roles_of(m).role == "method"}
        shared = shared_prefill(setup.model, ids, scored)
        scores = {m: setup.press_scores(m, shared) for m in scored}
        # The FullKV answer: whether FullKV finds the needle at all, and the Oracle's queries.
        start = clock(ids.device)
        answer = decode(
            setup.model,
            shared.cache,
            shared.next_logits,
            shared.prompt_len,
            sample.max_new_tokens,
            setup.full.eos_token_ids,
        )
        crop_to(shared.cache, shared.prompt_len)
        text = setup.tokenizer.decode(answer, skip_special_tokens=True)
        fullkv = task.needles.score(text, sample)[task.needles.metric]
        if UPPER_BOUND in dict(todo):
            response = torch.tensor([answer], device=ids.device)
            oracle = response_importance(setup.model, shared.cache, shared.prompt_len, response)
            scores[UPPER_BOUND] = (oracle[None], clock(ids.device) - start)
        for method, budget in todo:
            share = kept_share(setup.compressors[method].select(scores[method][0], ids, budget), positions)
            metrics = share_metrics(share)
            setup.results.add(
                ResultRow(
                    task=task.name,
                    sample=sample.id,
                    method=method,
                    budget=budget_key(budget),
                    setting=task.fixed_setting,
                    score=metrics[task.metric],
                    metrics=metrics,
                    per_head=[round(v, 4) for v in share.flatten().tolist()],
                    prompt_tokens=shared.prompt_len,
                    value_tokens=len(positions),
                    fullkv_score=fullkv,
                    prefill_s=shared.seconds,
                    score_s=scores[method][1],
                    meta=sample.meta,
                )
            )
