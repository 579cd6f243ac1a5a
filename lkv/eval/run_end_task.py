"""End tasks under eviction: per (sample, setting) one shared prefill, the FullKV answer, then every method's
answer from the same prefill, decoded in batches where the method's cache is fixed after eviction
(:class:`EndTaskRun`; the protocol is in :mod:`lkv.eval.runner`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from lkv.core.budget import Budget
from lkv.core.clock import clock
from lkv.core.context import fit_context
from lkv.core.generation import crop_to
from lkv.core.importance import response_importance
from lkv.core.progress import Progress
from lkv.eval.batched_decode import AnswerBatches, AnswerRequest, Settled, answer_request, decode_batch
from lkv.eval.prefill import Prefilled, shared_prefill
from lkv.eval.results import FULL, ResultRow, budget_key, check_same_samples
from lkv.eval.setup import EvalSetup
from lkv.eval.tasks import Sample, Task, encode_sample
from lkv.eval.tasks.metrics import answer_agreement
from lkv.eval.units import Unit, device_batch_tokens
from lkv.eviction.compressor import Compressor
from lkv.eviction.records import Generation, ScoredPrompt
from lkv.eviction.roles import REFERENCE, roles_of


class EndTaskRun:
    """Runs end tasks (:class:`~lkv.eval.tasks.Task`) on ``setup``'s methods, appending their rows."""

    def __init__(self, setup: EvalSetup) -> None:
        self.setup = setup

    def _pending(self, task: str, sample: str, setting: str) -> list[tuple[str, Budget | None]]:
        todo = []
        for method in self.setup.methods:
            for budget in [None] if roles_of(method).role == "reference" else self.setup.budgets:
                if (task, sample, method, budget_key(budget), setting) not in self.setup.results.done:
                    todo.append((method, budget))
        return todo

    def run(self, task: Task) -> None:
        """Every pending row of ``task``, chunk by chunk (longest prompts first)."""
        units, prompts = [], []
        samples, screen = task.samples(self.setup.tokenizer), self.setup.screen
        results = self.setup.results
        check_same_samples(
            {s.id: s.meta for s in samples}, results.rows, task.name, f"lkv eval: {results.path}"
        )
        if screen is not None:
            samples = screen.samples(task.name, samples, self.setup.settings)
        for sample in self.setup.shard.of(samples):
            context, question = encode_sample(sample, self.setup.tokenizer, self.setup.enable_thinking)
            reserve = len(question) + sample.max_new_tokens
            where = f"task {task.name}, sample {sample.id}: the prompt"
            context = fit_context(context, reserve, self.setup.context, self.setup.truncate, where)
            for setting in self.setup.settings:
                if screen is not None and not screen.keeps(task.name, sample.id, setting):
                    continue
                todo = self._pending(task.name, sample.id, setting)
                unit = Unit(sample, setting, context, question, todo)
                prompts.append(unit.prompt)
                if todo:
                    units.append(unit)
        if units and self.setup.selection.head_budget == "threshold":
            self.setup.calibrate(prompts)
        # Prompts of similar length share a chunk, so the chunk's FullKV answers (uncompressed) pad little.
        units.sort(key=lambda unit: -unit.entries)
        if self.setup.max_batch_tokens is None and self.setup.token_cap is None:
            # once, with the model loaded and no cache held
            self.setup.token_cap = device_batch_tokens(self.setup.model)
        bar = Progress(f"lkv eval: {task.name}", len(units), "prompts", self.setup.progress)
        for chunk in self._chunks(units):
            self._run_chunk(task, chunk)
            bar.update(len(chunk), f"{chunk[-1].sample.id} {chunk[-1].setting}")
        bar.close()

    def _chunks(self, units: list[Unit]) -> Iterator[list[Unit]]:
        """``units`` (longest first) in chunks of at most ``batch_size`` whose stacked full caches, the count
        × the first (longest) one's entries, hold at most ``max_batch_tokens`` or the derived cap (a longer
        unit goes alone)."""
        chunk: list[Unit] = []
        limit = (
            self.setup.max_batch_tokens if self.setup.max_batch_tokens is not None else self.setup.token_cap
        )
        for unit in units:
            if chunk and (
                len(chunk) == self.setup.batch_size
                or (limit is not None and (len(chunk) + 1) * chunk[0].entries > limit)
            ):
                yield chunk
                chunk = []
            chunk.append(unit)
        if chunk:
            yield chunk

    def _run_chunk(self, task: Task, units: list[Unit]) -> None:
        """Every pending row of ``units``: one shared prefill each, the FullKV answers decoded together, then
        every other (method, budget) answer, batched where the method's cache is fixed after eviction.

        Memory (docs/scale_out.md): each shared prefill is copied straight into the stacked cache that the
        FullKV answers decode from, and let go once copied. As each FullKV answer ends, its prompt's entries
        are cut out of the stack (one copy) and every other method scores and evicts that copy, which is let
        go before decoding goes on. So the stack and one prompt's cache are the only full caches held, plus
        the evicted ones waiting in ``batches``.
        """
        batches = AnswerBatches(
            self.setup.model, self.setup.tokenizer, self.setup.full.eos_token_ids, self.setup.batch_size
        )
        fresh = []
        for unit in units:
            unit.streams = {
                m for m, _ in unit.todo if self.setup.streamed and self.setup.compressors[m].press.streamable
            }
            unit.full = self.setup.results.done.get(
                (task.name, unit.sample.id, REFERENCE, FULL, unit.setting)
            )
            if unit.full is None:
                fresh.append(unit)
            else:  # the FullKV answer is known (a resumed run): a prefill of its own, then the other methods
                unit.shared = self._prefill(unit)
                self._other_methods(task, unit, batches)
        for unit, gen in self._full_answers(fresh):
            unit.full = result_row(
                self.setup, task, unit.sample, unit.setting, REFERENCE, None, gen, gen.text, 0.0
            ).as_json()
            if REFERENCE in self.setup.methods:
                self.setup.results.add(unit.full)
            self._other_methods(task, unit, batches)
        batches.flush()

    def _prefill(self, unit: Unit) -> Prefilled:
        """``unit``'s shared prefill, with the captures of every method that scores it."""
        ids = torch.tensor([unit.prompt], device=self.setup.full.device)
        scorers = {
            m: self.setup.compressors[m].press
            for m, _ in unit.todo
            if roles_of(m).role == "method" and m not in unit.streams  # the upper bound scores the answer
        }
        return shared_prefill(self.setup.model, ids, scorers)

    def _full_answers(self, units: list[Unit]) -> Iterator[tuple[Unit, Generation]]:
        """The FullKV answers of ``units``, decoded together, as each ends; the unit's ``shared.cache`` is then
        a copy of its prompt's entries cut out of the stack (let it go before asking for the next)."""

        def requests() -> Iterator[AnswerRequest]:
            for unit in units:
                unit.shared = self._prefill(unit)
                yield self._full_request(unit)

        if not units:  # every FullKV answer of the chunk is known (a resumed run)
            return
        lengths = [unit.entries for unit in units]
        eos = self.setup.full.eos_token_ids
        answers = decode_batch(
            self.setup.model, self.setup.tokenizer, eos, requests(), lengths, keep_prompt=True
        )
        for row, gen, cache in answers:
            unit = units[row]
            crop_to(cache, unit.shared.prompt_len)  # drop the appended question (question-agnostic)
            unit.shared.cache = cache
            del cache
            yield unit, gen

    def _full_request(self, unit: Unit) -> AnswerRequest:
        """The FullKV answer of ``unit``: it takes over the shared prefill's cache (no copy), appends the question
        to it (question-agnostic), and the stack then takes its entries."""
        scored = unit.full_scored()
        unit.shared.cache = None
        return answer_request(
            self.setup.model, self.setup.full.evict(scored, in_place=True), unit.appended, unit.sampling
        )

    def _other_methods(self, task: Task, unit: Unit, batches: AnswerBatches) -> None:
        """Every pending (method, budget) row of ``unit`` but FullKV's, from its shared prefill (let go after)."""
        self._score_methods(unit)
        for method, budget in unit.todo:
            if roles_of(method).role == "reference":
                continue
            if method in unit.streams:
                gen = self._generate_streamed(method, unit, budget)
                self.setup.results.add(self._method_row(task, unit, method, budget, gen.eviction_s)(gen))
            elif self.setup.compressors[method].decode_policy is not None:  # the cache changes while decoding
                gen = self._generate(self.setup.compressors[method], unit.scored[method], budget, unit)
                self.setup.results.add(self._method_row(task, unit, method, budget)(gen))
            else:
                request = self._request(
                    self.setup.compressors[method], unit.scored[method], budget, task, unit
                )
                batches.add(request, self._method_row(task, unit, method, budget, add=True), group=budget)
        unit.shared = unit.scored = None  # the full cache is no longer needed

    def _score_methods(self, unit: Unit) -> None:
        """Each scored method's :class:`ScoredPrompt` of ``unit``'s shared prefill (the Oracle's from the
        FullKV answer)."""
        shared, unit.scored = unit.shared, {}
        scored = (m for m, _ in unit.todo if roles_of(m).role != "reference" and m not in unit.streams)
        for method in dict.fromkeys(scored):
            if roles_of(method).role == "upper bound":
                start = clock(shared.ids.device)
                answer = unit.full["answer_ids"]
                ids = torch.tensor([unit.appended + answer], device=shared.ids.device)
                # the answer's queries only (question-agnostic: the question is appended before it)
                scores = response_importance(
                    self.setup.model, shared.cache, shared.prompt_len, ids, last_queries=len(answer)
                )[None]
                seconds = clock(shared.ids.device) - start
            else:
                scores, seconds = self.setup.press_scores(method, shared)
            unit.scored[method] = unit.full_scored(scores, seconds)

    def _method_row(
        self,
        task: Task,
        unit: Unit,
        method: str,
        budget: Budget | None,
        score_s: float | None = None,
        add: bool = False,
    ) -> Callable[[Generation], ResultRow]:
        """The result row of ``method``'s answer (``add``: also append it to the results file)."""
        reference = unit.full["prediction"]
        seconds = unit.scored[method].score_s if score_s is None else score_s

        def row(gen: Generation) -> ResultRow:
            made = result_row(
                self.setup, task, unit.sample, unit.setting, method, budget, gen, reference, seconds
            )
            if add:
                self.setup.results.add(made)
            return made

        return row

    def _request(
        self,
        compressor: Compressor,
        scored: ScoredPrompt,
        budget: Budget | None,
        task: Task,
        unit: Unit,
    ) -> AnswerRequest:
        """An answer to decode from ``scored`` evicted to ``budget`` (the kept entries gathered into a cache of
        its own); it ends once the task's score is settled (:attr:`Task.settles_at_full_score`)."""
        return answer_request(
            self.setup.model,
            compressor.evict(scored, budget),
            unit.appended,
            unit.sampling,
            settled_by(task, unit.sample),
        )

    def _generate(
        self, compressor: Compressor, scored: ScoredPrompt, budget: Budget | None, unit: Unit
    ) -> Generation:
        """One answer at batch 1 through the Compressor (decode-time policies act on the cache as it grows)."""
        compressed = compressor.evict(scored, budget)
        if unit.appended:
            return compressor.answer(compressed, unit.appended, unit.sampling)
        return compressor.decode(compressed, unit.sampling)

    def _generate_streamed(self, method: str, unit: Unit, budget: Budget) -> Generation:
        """Compress ``unit``'s prompt to ``budget`` with layer-streamed eviction (its own prefill), then answer."""
        ids = torch.tensor([unit.prompt], device=self.setup.full.device)
        return streamed_compressor(self.setup, method, budget).generate(
            ids, unit.sampling, unit.appended or None
        )


def result_row(
    setup: EvalSetup,
    task: Task,
    sample: Sample,
    setting: str,
    method: str,
    budget: Budget | None,
    gen: Generation,
    reference: str,
    score_s: float,
) -> ResultRow:
    """The result row of ``method``'s answer ``gen`` to ``sample`` (``reference``: the FullKV answer's text,
    which fidelity tasks score against and every other method's ``fullkv_f1`` compares with)."""
    metrics = task.score(gen.text, sample, reference if task.needs_reference else None)
    if roles_of(method).role != "reference":
        metrics["fullkv_f1"] = answer_agreement(gen.text, reference)  # agreement with FullKV, every task
    return ResultRow(
        task=task.name,
        sample=sample.id,
        method=method,
        budget=budget_key(budget),
        setting=setting,
        score=metrics[task.metric],
        metrics=metrics,
        prediction=gen.text,
        answers=sample.answers,
        answer_ids=gen.token_ids,
        finish=gen.finish_reason,
        prompt_tokens=gen.prompt_tokens,
        kept_tokens=sum(gen.kept_per_layer) / len(gen.kept_per_layer),
        kv_fraction=gen.kv_bytes_kept / gen.kv_bytes_full,
        prefill_s=gen.prefill_s,
        score_s=score_s,
        decode_s=gen.question_s + gen.decode_s,
        meta={k: v for k, v in sample.meta.items() if k != "all_classes"},
        **setup.threshold_fields(method, budget, gen),
    )


def settled_by(task: Task, sample: Sample) -> Settled | None:
    """When an answer to ``sample`` may stop early: once it scores 1, where no further token can change that
    (:attr:`Task.settles_at_full_score`); None: decode to ``max_new_tokens``."""
    if not task.settles_at_full_score:
        return None
    return lambda text: task.score(text, sample)[task.metric] >= 1.0


def streamed_compressor(setup: EvalSetup, method: str, budget: Budget) -> Compressor:
    """A Compressor of ``method``'s press and selection that compresses to ``budget`` with layer-streamed
    eviction (its own prefill, one layer's full K/V at a time)."""
    own = setup.compressors[method]
    return Compressor(
        setup.model,
        setup.tokenizer,
        own.press,
        budget,
        own.selection,
        streamed=True,
        thresholds=own.thresholds,
    )
