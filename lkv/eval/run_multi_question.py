"""Multi-question tasks in ``lkv eval`` (:mod:`lkv.eval.tasks.multi_question`): a context is compressed once
per (method, budget), then asked each of its questions (:class:`MultiQuestionRun`).

The question-agnostic protocol of a server that compresses a context once and answers several questions from
it. Per context: one shared prefill of the context (every scored method's capture rides on it), the FullKV
answers, then per method one scoring and per budget **one** eviction; each question is then appended to its
own copy of that compressed cache and answered. No question takes part in any compression, the compressed
cache is never re-compressed, and no question or answer leaks into the next: each answer decodes from a copy
of the compressed context cache, which stays as eviction left it (``tests/eval/test_multi_question.py`` proves
each answer equal to compressing the context once and asking that question alone).

What each method compresses with:

- FullKV: nothing is evicted; every question decodes from a copy of the full context cache. Its rows are
  the reference rows (``fullkv_f1`` of every other row compares with the same question's FullKV answer).
- The Oracle (an upper bound): the union over the context's questions of the attention each FullKV answer pays
  to the context, teacher-forced after its question with the answer's queries only (s_GT of docs/design.md §1,
  each normalised per layer and KV head), taken as the element-wise maximum over the questions. It knows
  every answer but still compresses once, like every other method: a per-question Oracle would re-compress
  per question, which the protocol forbids.
- A scored method: its scores of the shared prefill; a method with layer-streamed eviction (``streamed``): its
  own prefill per budget (:meth:`Compressor.compress_context`), once.
- Decode-time policies (``h2o-decode``, ...) answer each question at batch 1 through :meth:`Compressor.answer`
  (which copies the compressed cache); the other answers decode in batches (:mod:`lkv.eval.batched_decode`).

Rows: one per question, as the single-question runner makes them (:func:`lkv.eval.run_end_task.result_row`);
a row's ``score_s`` is its (method, context)'s one scoring. The per-context "all questions answered" rows
are derived in the report (:mod:`lkv.eval.all_answered`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from lkv.core.budget import Budget
from lkv.core.clock import clock
from lkv.core.context import fit_context
from lkv.core.generation import Sampling
from lkv.core.importance import response_importance
from lkv.core.progress import Progress
from lkv.eval.batched_decode import AnswerBatches, answer_request
from lkv.eval.prefill import Prefilled, shared_prefill
from lkv.eval.results import FULL, budget_key
from lkv.eval.run_end_task import result_row, settled_by, streamed_compressor
from lkv.eval.setup import EvalSetup
from lkv.eval.tasks import Sample, Task, encode_sample
from lkv.eviction.records import CompressedPrompt, Generation, ScoredPrompt
from lkv.eviction.roles import REFERENCE, roles_of

SETTING = "agnostic"  # the only setting a multi-question task runs in (no single question to compress with)


def contexts_of(samples: list[Sample]) -> list[list[Sample]]:
    """The samples grouped by ``meta["context_id"]``, in first-seen order; every sample of a group must share
    its context text."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.meta["context_id"], []).append(sample)
    for context_id, group in groups.items():
        if any(s.context != group[0].context for s in group):
            raise ValueError(f"context {context_id}: its questions' samples hold different context texts")
    return list(groups.values())


class MultiQuestionRun:
    """Runs multi-question tasks on ``setup``'s methods (question-agnostic only), appending their rows."""

    def __init__(self, setup: EvalSetup) -> None:
        self.setup = setup

    def run(self, task: Task) -> None:
        """Every pending row of ``task``, context by context."""
        todo, contexts = [], []
        for group in self.setup.shard.of(contexts_of(task.samples(self.setup.tokenizer))):
            context, questions = self._encode(task, group)
            contexts.append(context)
            pending = self._pending(task, group)
            if pending:
                todo.append((group, context, questions, pending))
        if todo and self.setup.selection.head_budget == "threshold":
            self.setup.calibrate(contexts)
        bar = Progress(f"lkv eval: {task.name}", len(todo), "contexts", self.setup.progress)
        for group, context, questions, pending in todo:
            self._run_context(task, group, context, questions, pending)
            bar.update(1, group[0].meta["context_id"])
        bar.close()

    def _encode(self, task: Task, group: list[Sample]) -> tuple[list[int], list[list[int]]]:
        """The context's tokens (cut to fit the model's context under ``truncate``) and each question's."""
        encoded = [encode_sample(s, self.setup.tokenizer, self.setup.enable_thinking) for s in group]
        questions = [question for _, question in encoded]
        reserve = max(len(q) + s.max_new_tokens for q, s in zip(questions, group, strict=True))
        where = f"task {task.name}, context {group[0].meta['context_id']}: the prompt"
        context = fit_context(encoded[0][0], reserve, self.setup.context, self.setup.truncate, where)
        return context, questions

    def _pending(self, task: Task, group: list[Sample]) -> list[tuple[str, Budget | None]]:
        """(method, budget) pairs with a question of ``group`` left to answer."""
        todo = []
        for method in self.setup.methods:
            for budget in [None] if roles_of(method).role == "reference" else self.setup.budgets:
                keys = [(task.name, s.id, method, budget_key(budget), SETTING) for s in group]
                if any(key not in self.setup.results.done for key in keys):
                    todo.append((method, budget))
        return todo

    def _run_context(
        self,
        task: Task,
        group: list[Sample],
        context: list[int],
        questions: list[list[int]],
        todo: list[tuple[str, Budget | None]],
    ) -> None:
        """One prefill of ``context``, the FullKV answers, then per (method, budget) one compression whose
        copies answer every question."""
        ids = torch.tensor([context], device=self.setup.full.device)
        streams = {m for m, _ in todo if self.setup.streamed and self.setup.compressors[m].press.streamable}
        scorers = {
            m: self.setup.compressors[m].press
            for m, _ in todo
            if roles_of(m).role == "method" and m not in streams
        }
        shared = shared_prefill(self.setup.model, ids, scorers)
        full = self._full_answers(task, group, questions, shared)
        batches = self._batches()
        for method in dict.fromkeys(m for m, _ in todo if roles_of(m).role != "reference"):
            scored = None if method in streams else self._score(method, shared, questions, full)
            for budget in [b for m, b in todo if m == method]:
                if scored is None:
                    compressed = streamed_compressor(self.setup, method, budget).compress_context(ids)
                    seconds = compressed.eviction_s
                else:
                    compressed = self.setup.compressors[method].evict(scored, budget)
                    seconds = scored.score_s
                self._ask(task, group, questions, method, budget, compressed, full, batches, seconds)
        batches.flush()

    def _batches(self) -> AnswerBatches:
        setup = self.setup
        return AnswerBatches(setup.model, setup.tokenizer, setup.full.eos_token_ids, setup.batch_size)

    def _full_answers(
        self, task: Task, group: list[Sample], questions: list[list[int]], shared: Prefilled
    ) -> list[dict[str, Any]]:
        """The FullKV row of each question: read back when every one is in the results (a resumed run), else
        answered from copies of the full context cache (and added where FullKV is one of the methods)."""
        done = [self.setup.results.done.get((task.name, s.id, REFERENCE, FULL, SETTING)) for s in group]
        if all(row is not None for row in done):
            return done
        compressed = self.setup.full.evict(shared.scored(), in_place=True)  # evicts nothing: the same cache
        batches = self._batches()
        made = self._ask(task, group, questions, REFERENCE, None, compressed, None, batches, 0.0)
        batches.flush()
        return made

    def _score(
        self, method: str, shared: Prefilled, questions: list[list[int]], full: list[dict[str, Any]]
    ) -> ScoredPrompt:
        """``method``'s scores of the shared prefill; the Oracle's: the element-wise maximum over the questions
        of the attention each FullKV answer pays to the context, after its question."""
        if roles_of(method).role != "upper bound":
            return shared.scored(*self.setup.press_scores(method, shared))
        device = shared.ids.device
        start = clock(device)
        per_question = [
            response_importance(
                self.setup.model,
                shared.cache,
                shared.prompt_len,
                torch.tensor([question + row["answer_ids"]], device=device),
                last_queries=len(row["answer_ids"]),
            )
            for question, row in zip(questions, full, strict=True)
            if row["answer_ids"]
        ]
        if per_question:
            scores = torch.stack(per_question).amax(dim=0)[None]
        else:  # every FullKV answer is empty: nothing to attend with, the Oracle keeps only its windows
            keys = shared.cache.layers[0].keys
            scores = torch.zeros(1, len(shared.cache.layers), keys.shape[1], shared.prompt_len, device=device)
        return shared.scored(scores, clock(device) - start)

    def _ask(
        self,
        task: Task,
        group: list[Sample],
        questions: list[list[int]],
        method: str,
        budget: Budget | None,
        compressed: CompressedPrompt,
        full: list[dict[str, Any]] | None,
        batches: AnswerBatches,
        score_s: float,
    ) -> list[dict[str, Any]]:
        """Answer every question of ``group`` from its own copy of ``compressed`` (left untouched) and add the
        rows not yet in the results; returns the rows, filled in as their answers end (by ``batches.flush()``).

        Args:
            full: each question's FullKV row (their answers are the references); None for FullKV itself.
        """
        made: list[dict[str, Any]] = [{} for _ in group]
        compressor = self.setup.compressors.get(method) or self.setup.full
        for index, (sample, question) in enumerate(zip(group, questions, strict=True)):
            sampling = Sampling(max_new_tokens=sample.max_new_tokens, stop=tuple(sample.stop))
            reference = None if full is None else full[index]["prediction"]
            done = self._row(task, sample, method, budget, reference, score_s, made, index)
            if compressor.decode_policy is not None:  # the cache changes while decoding: batch 1
                done(compressor.answer(compressed, question, sampling))
                continue
            own = replace(compressed, cache=copy.deepcopy(compressed.cache))
            request = answer_request(self.setup.model, own, question, sampling, settled_by(task, sample))
            batches.add(request, done, group=budget)
        return made

    def _row(
        self,
        task: Task,
        sample: Sample,
        method: str,
        budget: Budget | None,
        reference: str | None,
        score_s: float,
        made: list[dict[str, Any]],
        index: int,
    ) -> Callable[[Generation], None]:
        """What to do with an answer: its row goes to ``made[index]`` and, unless already done (or FullKV is
        not one of the methods), to the results file."""

        def done(gen: Generation) -> None:
            row = result_row(
                self.setup,
                task,
                sample,
                SETTING,
                method,
                budget,
                gen,
                gen.text if reference is None else reference,
                score_s,
            ).as_json()
            made[index].update(row)
            key = (task.name, sample.id, method, budget_key(budget), SETTING)
            if key not in self.setup.results.done and method in self.setup.methods:
                self.setup.results.add(row)

        return done
