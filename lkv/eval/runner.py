"""`lkv eval`: eviction methods × budgets × tasks × {question-aware, question-agnostic}, resumable, with reports.

    lkv eval --config configs/eval/niah.yaml --adapter runs/smollm2_135m/adapter

Per sample and setting the prompt is prefilled **once**: every method's prefill capture (SnapKV's window,
TOVA's last query, H2O's every query; identical ones shared) rides on that one forward pass, every method
scores the same cache, and each (method, budget) then gathers its kept entries and decodes. Up to
``batch_size`` (sample, setting) pairs go through together (fewer where prompts are long: ``max_batch_tokens``):
their answers are decoded in batches wherever the method's cache is fixed after eviction
(:mod:`lkv.eval.batched_decode`), and an answer of a string-match task stops once its score is settled
(:attr:`~lkv.eval.tasks.Task.settles_at_full_score`). At most the chunk's stacked full caches and one more
prompt's cache are held (:meth:`Evaluator._run_chunk`). The FullKV answer of each prompt is decoded first: it
is the FullKV result, the reference of fidelity tasks, and the source of the Oracle's scores — the attention
its own answer tokens pay to the prompt (teacher-forced on the full cache, after the question in the
question-agnostic setting), i.e. s_GT of docs/design.md §1 for the answer actually given.

Settings (see :mod:`lkv.eval.tasks.base`): ``aware`` prefills context + question and compresses it all
(the paper's protocol); ``agnostic`` compresses the context alone, then appends the question to the
compressed cache. The tokens are identical, so the settings differ only in when compression happens.

Output folder::

    results.jsonl    one row per (task, sample, method, budget, setting), appended and flushed as it is made;
                     a rerun skips finished rows (:mod:`lkv.eval.results`)
    run.json         model, adapter fingerprint, method settings and chat-template variables; a rerun with other
                     ones is refused
    summary.csv, report.md, plots/*.png, tensorboard/   (see :mod:`lkv.eval.report`)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.attention import AttentionCapture, ImportanceCapture
from lkv.core.budget import Budget
from lkv.core.cache import cache_bytes, token_bytes
from lkv.core.clock import clock
from lkv.core.context import Truncate, fit_context, model_context
from lkv.core.generation import Sampling, crop_to, decode, prefill
from lkv.core.importance import response_importance
from lkv.core.progress import Progress
from lkv.eval.batched_decode import AnswerBatches, AnswerRequest, answer_request, decode_batch
from lkv.eval.results import FULL, NO_BUDGET, RESULTS_FILE, ResultsFile, budget_key
from lkv.eval.tasks import Benchmark, ImportanceTask, Sample, Task, encode_sample
from lkv.eval.tasks.metrics import answer_agreement
from lkv.eval.tasks.needle_tokens import NeedleTokenTask, kept_share, share_metrics, value_positions
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress, Press, PressContext
from lkv.eviction.records import Generation, ScoredPrompt
from lkv.eviction.registry import REFERENCE, UPPER_BOUND, roles_of
from lkv.eviction.selector import DEFAULT_SELECTION, Selection
from lkv.model.backbone import model_signature

SETTINGS = ("aware", "agnostic")
Setting = Literal["aware", "agnostic"]


# Share of the device's free memory that a chunk's stacked full caches may take when no max_batch_tokens is
# given; the rest is for one prompt's cache copy (at most the stack's size), the prefill's activations, the
# evicted caches waiting to be decoded and the allocator's slack (docs/scale_out.md, "Evaluation memory").
CACHE_SHARE = 0.5


def device_batch_tokens(model: PreTrainedModel, share: float = CACHE_SHARE) -> int | None:
    """The most cached tokens a chunk may stack: ``share`` of the free device memory over one token's K/V bytes
    in every layer (:func:`lkv.core.cache.token_bytes`); None (no limit) off CUDA."""
    parameter = next(model.parameters())
    if parameter.device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(parameter.device)
    # memory the caching allocator holds but no tensor uses is free for the caches too
    free += torch.cuda.memory_reserved(parameter.device) - torch.cuda.memory_allocated(parameter.device)
    per_token = token_bytes(model.config.get_text_config(), parameter.element_size())
    return max(1, int(share * free / per_token))


@dataclass
class Prefilled:
    """One prefill shared by every method: ``ids (1, S)``, the full cache and each method's capture."""

    ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    captures: dict[str, AttentionCapture | None]
    seconds: float

    @property
    def prompt_len(self) -> int:
        return self.ids.shape[1]


@torch.no_grad()
def shared_prefill(model: PreTrainedModel, ids: torch.Tensor, presses: dict[str, Press]) -> Prefilled:
    """Prefill ``ids`` once with the captures of all ``presses``.

    Presses asking for the same attention capture (same kind, key count and query window) share one object: a
    press only reads the capture its prefill filled (LAQ/SpecKV capture their pseudo tokens in captures of
    their own). A probe's capture of the attention input is its own (it keeps only that probe's scores).
    """
    unique: dict[tuple[type, int, int | None] | int, AttentionCapture] = {}
    captures: dict[str, AttentionCapture | None] = {}
    for name, press in presses.items():
        capture = press.prefill_capture(ids.shape[1])
        if capture is not None:
            shared = isinstance(capture, ImportanceCapture)
            key = (type(capture), capture.num_keys, capture.last_queries) if shared else id(capture)
            capture = unique.setdefault(key, capture)
        captures[name] = capture
    kwargs = {"lkv_capture": list(unique.values())} if unique else {}
    start = clock(ids.device)
    cache, next_logits = prefill(model, ids, **kwargs)
    return Prefilled(ids, cache, next_logits, captures, clock(ids.device) - start)


def with_protected(scores: torch.Tensor, press: Press) -> torch.Tensor:
    """``scores (..., S)`` with the positions ``press`` always keeps (sink, recent window) set to ``+inf``."""
    prompt_len = scores.shape[-1]
    sink, recent = press.protected(prompt_len)
    out = scores.float().clone()
    out[..., :sink] = float("inf")
    if recent:
        out[..., prompt_len - recent :] = float("inf")
    return out


@dataclass
class _Unit:
    """One (sample, setting) with rows to make, and what the runner computes for it on the way."""

    sample: Sample
    setting: str
    context: list[int]
    question: list[int]
    todo: list[tuple[str, Budget | None]]
    streams: set[str] = field(default_factory=set)
    shared: Prefilled | None = None
    full: dict[str, Any] | None = None
    scored: dict[str, ScoredPrompt] | None = None

    @property
    def entries(self) -> int:
        """Cached entries when its answer starts: the prompt and, question-agnostic, the appended question."""
        return len(self.context) + len(self.question)

    @property
    def prompt(self) -> list[int]:
        """The tokens prefilled (and compressed): context + question when aware, the context when agnostic."""
        return self.context + self.question if self.setting == "aware" else self.context

    @property
    def appended(self) -> list[int]:
        """Tokens appended to the compressed cache: the question when agnostic, else none."""
        return [] if self.setting == "aware" else self.question

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_new_tokens=self.sample.max_new_tokens, stop=tuple(self.sample.stop))

    def full_scored(self, scores: torch.Tensor | None = None, score_s: float = 0.0) -> ScoredPrompt:
        """The shared prefill as a :class:`ScoredPrompt` with a method's ``scores`` (none: FullKV)."""
        shared = self.shared
        return ScoredPrompt(
            shared.ids,
            shared.cache,
            shared.next_logits,
            scores,
            cache_bytes(shared.cache),
            shared.seconds,
            score_s,
        )


class Evaluator:
    """Runs benchmarks for a set of eviction methods on one model, appending rows to ``output/results.jsonl``.

    Args:
        model: the model every method compresses (for LookaheadKV: the base model its adapter is injected in).
        tokenizer: its tokenizer.
        presses: method name → press. ``fullkv`` and ``oracle`` need no real press (any instance will do:
            FullKV keeps everything, the Oracle's scores come from the FullKV answer).
        budgets: tokens kept per KV head (ints) or ratios of the prompt (floats), checked here
            (:class:`~lkv.core.budget.Budget`).
        settings: ``aware`` and/or ``agnostic``.
        output: result folder.
        progress: show progress bars.
        streamed: methods that can (:attr:`Press.streamable`) compress each (prompt, budget) with layer-streamed
            eviction (:mod:`lkv.eviction.streamed`: a prefill of their own per budget, one layer's full K/V at a
            time, the same answers); the others score the shared prefill.
        batch_size: answers decoded together (:mod:`lkv.eval.batched_decode`), and the most (sample, setting)
            pairs per chunk (their full caches are held together, stacked). 1 decodes one answer at a time.
        max_batch_tokens: the most cached tokens of a chunk's stacked full caches (pairs × the longest one's
            entries); a chunk holds fewer pairs where prompts are long. None: derived from the device's free
            memory (:func:`device_batch_tokens`; no limit on a CPU). The peak is in docs/scale_out.md.
        enable_thinking: the chat template's variable the samples are rendered with
            (:func:`lkv.eval.tasks.encode_sample`; off, as labels are rendered).
        selection: every method's selector settings (:class:`~lkv.eviction.selector.Selection`), e.g. how its
            budget is spread over the KV heads of a layer: ``equal``, ``adaptive`` (AdaKV) or ``threshold``
            (KVzap's DMS: per task, method and budget one threshold calibrated on every prompt the task
            compresses, both settings, so the mean kept entries per (layer, KV head) is the budget;
            :meth:`Compressor.calibrate`, an extra prefill per prompt and method; the Oracle, scored from the
            FullKV answer, is matched per prompt instead). Its rows add ``threshold`` and ``kept_std``.
        truncate: a sample whose context, question and answer tokens do not fit in the model's context
            (:func:`lkv.core.context.fit_context`): ``error`` refuses it before the task's first prefill;
            ``left`` or ``middle`` cut its context.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        presses: dict[str, Press],
        budgets: Iterable[Budget | int | float],
        settings: Iterable[Setting] = SETTINGS,
        output: str | Path = "reports/eval",
        progress: bool = True,
        streamed: bool = False,
        batch_size: int = 8,
        enable_thinking: bool = False,
        max_batch_tokens: int | None = None,
        selection: Selection = DEFAULT_SELECTION,
        truncate: Truncate = "error",
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if max_batch_tokens is not None and max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.budgets = [Budget.of(budget) for budget in budgets]
        self.settings = list(settings)
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or not self.settings:
            raise ValueError(f"settings must be a non-empty subset of {SETTINGS}, got {self.settings}")
        if not self.budgets:
            raise ValueError("give at least one budget")
        self.methods = list(presses)
        self.compressors = {
            name: Compressor(model, tokenizer, press, selection=selection) for name, press in presses.items()
        }
        self.full = self.compressors.get(REFERENCE) or Compressor(model, tokenizer, FullKVPress())
        self.output = Path(output)
        self.results = ResultsFile(self.output / RESULTS_FILE)
        self.progress = progress
        self.streamed = streamed
        self.batch_size = batch_size
        self.enable_thinking = enable_thinking
        self.max_batch_tokens = max_batch_tokens
        self.truncate = truncate
        self.selection = selection
        self.context = model_context(model)
        self.token_cap: int | None = None  # derived from the free device memory when max_batch_tokens is None

    def run(self, benchmarks: Iterable[Benchmark]) -> list[dict[str, Any]]:
        """Run every benchmark (finished rows are skipped) and return all rows of the results file."""
        for benchmark in benchmarks:
            if isinstance(benchmark, ImportanceTask):
                self._importance(benchmark)
            elif isinstance(benchmark, NeedleTokenTask):
                self._needle_tokens(benchmark)
            elif isinstance(benchmark, Task):
                self._end_task(benchmark)
            else:
                raise TypeError(f"{type(benchmark).__name__} is neither a Task nor an ImportanceTask")
        return self.results.rows

    # --- end tasks ----------------------------------------------------------------------------------------

    def _pending(self, task: str, sample: str, setting: str) -> list[tuple[str, Budget | None]]:
        todo = []
        for method in self.methods:
            for budget in [None] if roles_of(method).role == "reference" else self.budgets:
                if (task, sample, method, budget_key(budget), setting) not in self.results.done:
                    todo.append((method, budget))
        return todo

    def _end_task(self, task: Task) -> None:
        units, prompts = [], []
        for sample in task.samples(self.tokenizer):
            context, question = encode_sample(sample, self.tokenizer, self.enable_thinking)
            reserve = len(question) + sample.max_new_tokens
            where = f"task {task.name}, sample {sample.id}: the prompt"
            context = fit_context(context, reserve, self.context, self.truncate, where)
            for setting in self.settings:
                todo = self._pending(task.name, sample.id, setting)
                unit = _Unit(sample, setting, context, question, todo)
                prompts.append(unit.prompt)
                if todo:
                    units.append(unit)
        if units and self.selection.head_budget == "threshold":
            self._calibrate(prompts)
        # Prompts of similar length share a chunk, so the chunk's FullKV answers (uncompressed) pad little.
        units.sort(key=lambda unit: -unit.entries)
        if self.max_batch_tokens is None and self.token_cap is None:
            self.token_cap = device_batch_tokens(self.model)  # once, with the model loaded and no cache held
        bar = Progress(f"lkv eval: {task.name}", len(units), "prompts", self.progress)
        for chunk in self._chunks(units):
            self._run_chunk(task, chunk)
            bar.update(len(chunk), f"{chunk[-1].sample.id} {chunk[-1].setting}")
        bar.close()

    def _calibrate(self, prompts: list[list[int]]) -> None:
        """Under ``threshold`` selection, each scored method's threshold per budget over ``prompts`` (a task's)."""
        for method, compressor in self.compressors.items():
            if roles_of(method).role == "method":
                compressor.thresholds = compressor.calibrate(prompts, self.budgets)

    def _chunks(self, units: list[_Unit]) -> Iterator[list[_Unit]]:
        """``units`` (longest first) in chunks of at most ``batch_size`` whose stacked full caches, the count
        × the first (longest) one's entries, hold at most ``max_batch_tokens`` or the derived cap (a longer
        unit goes alone)."""
        chunk: list[_Unit] = []
        limit = self.max_batch_tokens if self.max_batch_tokens is not None else self.token_cap
        for unit in units:
            if chunk and (
                len(chunk) == self.batch_size
                or (limit is not None and (len(chunk) + 1) * chunk[0].entries > limit)
            ):
                yield chunk
                chunk = []
            chunk.append(unit)
        if chunk:
            yield chunk

    def _run_chunk(self, task: Task, units: list[_Unit]) -> None:
        """Every pending row of ``units``: one shared prefill each, the FullKV answers decoded together, then
        every other (method, budget) answer, batched where the method's cache is fixed after eviction.

        Memory (docs/scale_out.md): each shared prefill is copied straight into the stacked cache that the
        FullKV answers decode from, and let go once copied. As each FullKV answer ends, its prompt's entries
        are cut out of the stack (one copy) and every other method scores and evicts that copy, which is let
        go before decoding goes on. So the stack and one prompt's cache are the only full caches held, plus
        the evicted ones waiting in ``batches``.
        """
        batches = AnswerBatches(self.model, self.tokenizer, self.full.eos_token_ids, self.batch_size)
        fresh = []
        for unit in units:
            unit.streams = {m for m, _ in unit.todo if self.streamed and self.compressors[m].press.streamable}
            unit.full = self.results.done.get((task.name, unit.sample.id, REFERENCE, FULL, unit.setting))
            if unit.full is None:
                fresh.append(unit)
            else:  # the FullKV answer is known (a resumed run): a prefill of its own, then the other methods
                unit.shared = self._prefill(unit)
                self._other_methods(task, unit, batches)
        for unit, gen in self._full_answers(fresh):
            unit.full = self._row(task, unit.sample, unit.setting, REFERENCE, None, gen, gen.text, 0.0)
            if REFERENCE in self.methods:
                self.results.add(unit.full)
            self._other_methods(task, unit, batches)
        batches.flush()

    def _prefill(self, unit: _Unit) -> Prefilled:
        """``unit``'s shared prefill, with the captures of every method that scores it."""
        ids = torch.tensor([unit.prompt], device=self.full.device)
        scorers = {
            m: self.compressors[m].press
            for m, _ in unit.todo
            if roles_of(m).role == "method" and m not in unit.streams  # the upper bound scores the answer
        }
        return shared_prefill(self.model, ids, scorers)

    def _full_answers(self, units: list[_Unit]) -> Iterator[tuple[_Unit, Generation]]:
        """The FullKV answers of ``units``, decoded together, as each ends; the unit's ``shared.cache`` is then
        a copy of its prompt's entries cut out of the stack (let it go before asking for the next)."""

        def requests() -> Iterator[AnswerRequest]:
            for unit in units:
                unit.shared = self._prefill(unit)
                yield self._full_request(unit)

        if not units:  # every FullKV answer of the chunk is known (a resumed run)
            return
        lengths = [unit.entries for unit in units]
        eos = self.full.eos_token_ids
        answers = decode_batch(self.model, self.tokenizer, eos, requests(), lengths, keep_prompt=True)
        for row, gen, cache in answers:
            unit = units[row]
            crop_to(cache, unit.shared.prompt_len)  # drop the appended question (question-agnostic)
            unit.shared.cache = cache
            del cache
            yield unit, gen

    def _full_request(self, unit: _Unit) -> AnswerRequest:
        """The FullKV answer of ``unit``: it takes over the shared prefill's cache (no copy), appends the question
        to it (question-agnostic), and the stack then takes its entries."""
        scored = unit.full_scored()
        unit.shared.cache = None
        return answer_request(
            self.model, self.full.evict(scored, in_place=True), unit.appended, unit.sampling
        )

    def _other_methods(self, task: Task, unit: _Unit, batches: AnswerBatches) -> None:
        """Every pending (method, budget) row of ``unit`` but FullKV's, from its shared prefill (let go after)."""
        self._score_methods(unit)
        for method, budget in unit.todo:
            if roles_of(method).role == "reference":
                continue
            if method in unit.streams:
                gen = self._generate_streamed(method, unit, budget)
                self.results.add(self._method_row(task, unit, method, budget, gen.eviction_s)(gen))
            elif self.compressors[method].decode_policy is not None:  # the cache changes while decoding
                gen = self._generate(self.compressors[method], unit.scored[method], budget, unit)
                self.results.add(self._method_row(task, unit, method, budget)(gen))
            else:
                request = self._request(self.compressors[method], unit.scored[method], budget, task, unit)
                batches.add(request, self._method_row(task, unit, method, budget, add=True), group=budget)
        unit.shared = unit.scored = None  # the full cache is no longer needed

    def _score_methods(self, unit: _Unit) -> None:
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
                    self.model, shared.cache, shared.prompt_len, ids, last_queries=len(answer)
                )[None]
                seconds = clock(shared.ids.device) - start
            else:
                scores, seconds = self._press_scores(method, shared)
            unit.scored[method] = unit.full_scored(scores, seconds)

    def _method_row(
        self,
        task: Task,
        unit: _Unit,
        method: str,
        budget: Budget | None,
        score_s: float | None = None,
        add: bool = False,
    ) -> Callable[[Generation], dict[str, Any]]:
        """The result row of ``method``'s answer (``add``: also append it to the results file)."""
        reference = unit.full["prediction"]
        seconds = unit.scored[method].score_s if score_s is None else score_s

        def row(gen: Generation) -> dict[str, Any]:
            made = self._row(task, unit.sample, unit.setting, method, budget, gen, reference, seconds)
            if add:
                self.results.add(made)
            return made

        return row

    def _request(
        self,
        compressor: Compressor,
        scored: ScoredPrompt,
        budget: Budget | None,
        task: Task,
        unit: _Unit,
    ) -> AnswerRequest:
        """An answer to decode from ``scored`` evicted to ``budget`` (the kept entries gathered into a cache of
        its own); it ends once the task's score is settled (:attr:`Task.settles_at_full_score`)."""
        settled = None
        if task.settles_at_full_score:
            sample = unit.sample
            settled = lambda text: task.score(text, sample)[task.metric] >= 1.0  # noqa: E731
        return answer_request(
            self.model, compressor.evict(scored, budget), unit.appended, unit.sampling, settled
        )

    def _press_scores(self, method: str, shared: Prefilled) -> tuple[torch.Tensor, float]:
        """``method``'s ``(1, layers, kv_heads, S)`` scores of a shared prefill, and the seconds they took."""
        ctx = PressContext(
            self.model,
            shared.ids,
            shared.cache,
            shared.next_logits,
            shared.captures[method],
            self.full.eos_token_ids,
            self.tokenizer,
        )
        start = clock(shared.ids.device)
        scores = self.compressors[method].press.score(ctx)
        return scores, clock(shared.ids.device) - start

    def _generate(
        self, compressor: Compressor, scored: ScoredPrompt, budget: Budget | None, unit: _Unit
    ) -> Generation:
        """One answer at batch 1 through the Compressor (decode-time policies act on the cache as it grows)."""
        compressed = compressor.evict(scored, budget)
        if unit.appended:
            return compressor.answer(compressed, unit.appended, unit.sampling)
        return compressor.decode(compressed, unit.sampling)

    def _generate_streamed(self, method: str, unit: _Unit, budget: Budget) -> Generation:
        """Compress ``unit``'s prompt to ``budget`` with layer-streamed eviction (its own prefill), then answer."""
        own = self.compressors[method]
        compressor = Compressor(
            self.model,
            self.tokenizer,
            own.press,
            budget,
            own.selection,
            streamed=True,
            thresholds=own.thresholds,
        )
        ids = torch.tensor([unit.prompt], device=self.full.device)
        return compressor.generate(ids, unit.sampling, unit.appended or None)

    def _row(
        self,
        task: Task,
        sample: Sample,
        setting: str,
        method: str,
        budget: Budget | None,
        gen: Generation,
        reference: str,
        score_s: float,
    ) -> dict[str, Any]:
        metrics = task.score(gen.text, sample, reference if task.needs_reference else None)
        if roles_of(method).role != "reference":
            metrics["fullkv_f1"] = answer_agreement(gen.text, reference)  # agreement with FullKV, every task
        return {
            "task": task.name,
            "sample": sample.id,
            "method": method,
            "budget": budget_key(budget),
            "setting": setting,
            "score": metrics[task.metric],
            "metrics": metrics,
            "prediction": gen.text,
            "answers": sample.answers,
            "answer_ids": gen.token_ids,
            "finish": gen.finish_reason,
            "prompt_tokens": gen.prompt_tokens,
            "kept_tokens": sum(gen.kept_per_layer) / len(gen.kept_per_layer),
            "kv_fraction": gen.kv_bytes_kept / gen.kv_bytes_full,
            "prefill_s": gen.prefill_s,
            "score_s": score_s,
            "decode_s": gen.question_s + gen.decode_s,
            "meta": {k: v for k, v in sample.meta.items() if k != "all_classes"},
            **self._threshold_fields(method, budget, gen),
        }

    def _threshold_fields(self, method: str, budget: Budget | None, gen: Generation) -> dict[str, Any]:
        """Under ``threshold`` selection, a row's threshold (``None``: matched on its prompt) and ``kept_std``."""
        if self.selection.head_budget != "threshold" or budget is None:
            return {}
        return {"threshold": self.compressors[method].thresholds.get(budget), "kept_std": gen.kept_std}

    # --- importance quality -------------------------------------------------------------------------------

    def _importance(self, task: ImportanceTask) -> None:
        task.check_model(model_signature(self.model, self.tokenizer, "evaluated model"))
        methods = [m for m in self.methods if not roles_of(m).unranked]
        labels = task.samples(self.tokenizer)  # lazily: each holds a (layers, kv_heads, S) target
        for label in Progress(f"lkv eval: {task.name}", len(task), "prompts", self.progress).track(labels):
            todo = [
                m for m in methods if (task.name, label.id, m, NO_BUDGET, "aware") not in self.results.done
            ]
            if not todo:
                continue
            ids = torch.tensor([label.prompt_ids], device=self.full.device)
            presses = {m: self.compressors[m].press for m in todo}
            shared = shared_prefill(self.model, ids, presses)
            # the metrics are computed on the device that holds the scores (the model's)
            if label.target is None:  # a responses-only folder: the ground truth from this same prefill
                response = torch.tensor([label.response_ids], device=self.full.device)
                target = response_importance(self.model, shared.cache, shared.prompt_len, response)
            else:
                target = label.target.to(self.full.device)
            for method in todo:
                scores, seconds = self._press_scores(method, shared)
                metrics = task.score(with_protected(scores[0], presses[method]), target)
                self.results.add(
                    {
                        "task": task.name,
                        "sample": label.id,
                        "method": method,
                        "budget": NO_BUDGET,
                        "setting": "aware",
                        "score": metrics[task.metric],
                        "metrics": metrics,
                        "prompt_tokens": len(label.prompt_ids),
                        "prefill_s": shared.seconds,
                        "score_s": seconds,
                        "meta": {},
                    }
                )

    # --- needle-token retention (prefill only) -----------------------------------------------------------

    def _needle_tokens(self, task: NeedleTokenTask) -> None:
        """Per sample one prefill, every method's scores, and per budget the value tokens each head keeps."""
        # the upper bound has no ranking of its own to score, but it keeps needle tokens like any method
        methods = [m for m in self.methods if not roles_of(m).unranked or roles_of(m).role == "upper bound"]
        samples = list(task.samples(self.tokenizer))
        for sample in Progress(f"lkv eval: {task.name}", len(samples), "prompts", self.progress).track(
            samples
        ):
            todo = [
                (m, b)
                for m in methods
                for b in self.budgets
                if (task.name, sample.id, m, budget_key(b), "aware") not in self.results.done
            ]
            if not todo:
                continue
            context, question = encode_sample(sample, self.tokenizer)
            positions = value_positions(sample, self.tokenizer)
            ids = torch.tensor([context + question], device=self.full.device)
            scored = {m: self.compressors[m].press for m, _ in todo if roles_of(m).role == "method"}
            shared = shared_prefill(self.model, ids, scored)
            scores = {m: self._press_scores(m, shared) for m in scored}
            # The FullKV answer: whether FullKV finds the needle at all, and the Oracle's queries.
            start = clock(ids.device)
            answer = decode(
                self.model,
                shared.cache,
                shared.next_logits,
                shared.prompt_len,
                sample.max_new_tokens,
                self.full.eos_token_ids,
            )
            crop_to(shared.cache, shared.prompt_len)
            text = self.tokenizer.decode(answer, skip_special_tokens=True)
            fullkv = task.needles.score(text, sample)[task.needles.metric]
            if UPPER_BOUND in dict(todo):
                response = torch.tensor([answer], device=ids.device)
                oracle = response_importance(self.model, shared.cache, shared.prompt_len, response)
                scores[UPPER_BOUND] = (oracle[None], clock(ids.device) - start)
            for method, budget in todo:
                share = kept_share(self.compressors[method].select(scores[method][0], ids, budget), positions)
                metrics = share_metrics(share)
                self.results.add(
                    {
                        "task": task.name,
                        "sample": sample.id,
                        "method": method,
                        "budget": budget_key(budget),
                        "setting": "aware",
                        "score": metrics[task.metric],
                        "metrics": metrics,
                        "per_head": [round(v, 4) for v in share.flatten().tolist()],
                        "prompt_tokens": shared.prompt_len,
                        "value_tokens": len(positions),
                        "fullkv_score": fullkv,
                        "prefill_s": shared.seconds,
                        "score_s": scores[method][1],
                        "meta": sample.meta,
                    }
                )
