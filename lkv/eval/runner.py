"""`lkv eval`: eviction methods × budgets × tasks × {question-aware, question-agnostic}, resumable, with reports.

    lkv eval --config configs/eval/niah.yaml --adapter runs/smollm2_135m/adapter

Per sample and setting the prompt is prefilled **once**: every method's prefill capture (SnapKV's window,
TOVA's last query, H2O's every query; identical ones shared) rides on that one forward pass, every method
scores the same cache, and each (method, budget) then only evicts a copy and decodes. Up to ``batch_size``
(sample, setting) pairs go through together: their answers are decoded in batches wherever the method's cache
is fixed after eviction (:mod:`lkv.eval.batched_decode`), and an answer of a string-match task stops once its
score is settled (:attr:`~lkv.eval.tasks.Task.settles_at_full_score`). The FullKV answer is decoded first: it
is the FullKV result, the reference of fidelity tasks, and the source of the Oracle's scores — the attention
its own answer tokens pay to the prompt (teacher-forced on the full cache, after the question in the
question-agnostic setting), i.e. s_GT of docs/design.md §1 for the answer actually given.

Settings (see :mod:`lkv.eval.tasks.base`): ``aware`` prefills context + question and compresses it all
(the paper's protocol); ``agnostic`` compresses the context alone, then appends the question to the
compressed cache. The tokens are identical, so the settings differ only in when compression happens.

Output folder::

    results.jsonl    one row per (task, sample, method, budget, setting), appended and flushed as it is made;
                     a rerun skips finished rows (:mod:`lkv.eval.results`)
    run.json         model, adapter fingerprint and method settings; a rerun with other ones is refused
    summary.csv, report.md, plots/*.png, tensorboard/   (see :mod:`lkv.eval.report`)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.attention import ImportanceCapture
from lkv.core.cache import cache_bytes
from lkv.core.clock import clock
from lkv.core.compat import cache_kwargs
from lkv.core.generation import Sampling, crop_to, decode, prefill
from lkv.core.importance import response_importance
from lkv.eval.batched_decode import AnswerBatches, AnswerRequest, answer_request
from lkv.eval.cells import FULL, NO_BUDGET
from lkv.eval.results import RESULTS_FILE, ResultsFile
from lkv.eval.tasks import Benchmark, ImportanceTask, Sample, Task, encode_sample
from lkv.eval.tasks.importance import NOT_RANKED
from lkv.eval.tasks.metrics import answer_agreement
from lkv.eval.tasks.needle_tokens import NeedleTokenTask, kept_share, share_metrics, value_positions
from lkv.eviction.compressor import Compressor, Generation, ScoredPrompt
from lkv.eviction.presses import FullKVPress, Press, PressContext
from lkv.model.backbone import model_signature

SETTINGS = ("aware", "agnostic")
Setting = Literal["aware", "agnostic"]


def budget_key(method: str, budget: int | float | None) -> str:
    """The budget column of a result row."""
    if method == "fullkv":
        return FULL
    return NO_BUDGET if budget is None else str(budget)


@dataclass
class Prefilled:
    """One prefill shared by every method: ``ids (1, S)``, the full cache and each method's capture."""

    ids: torch.Tensor
    cache: DynamicCache
    next_logits: torch.Tensor
    captures: dict[str, ImportanceCapture | None]
    seconds: float

    @property
    def prompt_len(self) -> int:
        return self.ids.shape[1]


@torch.no_grad()
def shared_prefill(model: PreTrainedModel, ids: torch.Tensor, presses: dict[str, Press]) -> Prefilled:
    """Prefill ``ids`` once with the captures of all ``presses``.

    Presses asking for the same capture (same kind, key count and query window) share one object: a press
    only reads the capture its prefill filled (LAQ/SpecKV capture their pseudo tokens in captures of their own).
    """
    unique: dict[tuple[type, int, int | None], ImportanceCapture] = {}
    captures: dict[str, ImportanceCapture | None] = {}
    for name, press in presses.items():
        capture = press.prefill_capture(ids.shape[1])
        if capture is not None:
            capture = unique.setdefault((type(capture), capture.num_keys, capture.last_queries), capture)
        captures[name] = capture
    kwargs = {"lkv_capture": list(unique.values())} if unique else {}
    start = clock(ids.device)
    cache, next_logits = prefill(model, ids, **kwargs)
    return Prefilled(ids, cache, next_logits, captures, clock(ids.device) - start)


@torch.no_grad()
def answer_importance(
    model: PreTrainedModel, cache: DynamicCache, prompt_len: int, appended: list[int], answer: list[int]
) -> torch.Tensor:
    """Oracle scores ``(1, layers, kv_heads, S)``: attention of the ``answer`` tokens on the prompt's keys.

    ``appended`` (the question, question-agnostic setting) and ``answer`` are teacher-forced on the prompt's
    full cache; only the answer's queries are reduced. The cache is cropped back to ``prompt_len``.
    """
    capture = ImportanceCapture(prompt_len, last_queries=len(answer))
    ids = torch.tensor([appended + answer], device=cache.layers[0].keys.device)
    try:
        model(input_ids=ids, **cache_kwargs(cache), use_cache=True, logits_to_keep=1, lkv_capture=capture)
    finally:
        crop_to(cache, prompt_len)
    return capture.scores(model.config.num_hidden_layers)


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
    todo: list[tuple[str, int | float | None]]
    streams: set[str] = field(default_factory=set)
    shared: Prefilled | None = None
    full: dict[str, Any] | None = None
    full_gen: Generation | None = None
    scored: dict[str, ScoredPrompt] | None = None

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

    def full_done(self, gen: Generation) -> None:
        self.full_gen = gen

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
        budgets: tokens kept per KV head (ints) or ratios of the prompt (floats).
        settings: ``aware`` and/or ``agnostic``.
        output: result folder.
        progress: show progress bars.
        streamed: methods that can (:attr:`Press.streamable`) compress each (prompt, budget) with layer-streamed
            eviction (:mod:`lkv.eviction.streamed`: a prefill of their own per budget, one layer's full K/V at a
            time, the same answers); the others score the shared prefill.
        batch_size: answers decoded together (:mod:`lkv.eval.batched_decode`), and (sample, setting) pairs
            prefilled per chunk (their full caches are held together). 1 decodes one answer at a time.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        presses: dict[str, Press],
        budgets: Iterable[int | float],
        settings: Iterable[Setting] = SETTINGS,
        output: str | Path = "reports/eval",
        progress: bool = True,
        streamed: bool = False,
        batch_size: int = 8,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.budgets = list(budgets)
        self.settings = list(settings)
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or not self.settings:
            raise ValueError(f"settings must be a non-empty subset of {SETTINGS}, got {self.settings}")
        if not self.budgets:
            raise ValueError("give at least one budget")
        self.methods = list(presses)
        self.compressors = {name: Compressor(model, tokenizer, press) for name, press in presses.items()}
        self.full = self.compressors.get("fullkv") or Compressor(model, tokenizer, FullKVPress())
        self.output = Path(output)
        self.results = ResultsFile(self.output / RESULTS_FILE)
        self.progress = progress
        self.streamed = streamed
        self.batch_size = batch_size

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

    def _pending(self, task: str, sample: str, setting: str) -> list[tuple[str, int | float | None]]:
        todo = []
        for method in self.methods:
            for budget in [None] if method == "fullkv" else self.budgets:
                if (task, sample, method, budget_key(method, budget), setting) not in self.results.done:
                    todo.append((method, budget))
        return todo

    def _end_task(self, task: Task) -> None:
        units = []
        for sample in task.samples(self.tokenizer):
            context, question = encode_sample(sample, self.tokenizer)
            for setting in self.settings:
                todo = self._pending(task.name, sample.id, setting)
                if todo:
                    units.append(_Unit(sample, setting, context, question, todo))
        # Prompts of similar length share a chunk, so the chunk's FullKV answers (uncompressed) pad little.
        units.sort(key=lambda unit: -len(unit.context) - len(unit.question))
        bar = tqdm(total=len(units), desc=f"eval {task.name}", unit="prompt", disable=not self.progress)
        for start in range(0, len(units), self.batch_size):
            chunk = units[start : start + self.batch_size]
            bar.set_postfix_str(f"{chunk[0].sample.id} {chunk[0].setting}")
            self._run_chunk(task, chunk)
            bar.update(len(chunk))
        bar.close()

    def _run_chunk(self, task: Task, units: list[_Unit]) -> None:
        """Every pending row of ``units`` (up to ``batch_size`` (sample, setting) pairs): one shared prefill
        each, the FullKV answers decoded together, then every other (method, budget) answer, batched where
        the method's cache is fixed after eviction."""
        batches = AnswerBatches(self.model, self.tokenizer, self.full.eos_token_ids, self.batch_size)
        for unit in units:
            ids = torch.tensor([unit.prompt], device=self.full.device)
            unit.streams = {m for m, _ in unit.todo if self.streamed and self.compressors[m].press.streamable}
            scorers = {
                m: self.compressors[m].press
                for m, _ in unit.todo
                if m not in ("fullkv", "oracle") and m not in unit.streams
            }
            unit.shared = shared_prefill(self.model, ids, scorers)
            unit.full = self.results.done.get((task.name, unit.sample.id, "fullkv", FULL, unit.setting))
            if unit.full is None:
                batches.add(
                    self._request(self.full, unit.full_scored(), None, task, unit, False), unit.full_done
                )
        batches.flush()  # the FullKV answers are the references and the Oracle's source
        for unit in units:
            if unit.full is None:
                unit.full = self._row(
                    task, unit.sample, unit.setting, "fullkv", None, unit.full_gen, unit.full_gen.text, 0.0
                )
                if "fullkv" in self.methods:
                    self.results.add(unit.full)
            self._score_methods(unit)
            for method, budget in unit.todo:
                if method == "fullkv":
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
        batches.flush()

    def _score_methods(self, unit: _Unit) -> None:
        """Each scored method's :class:`ScoredPrompt` of ``unit``'s shared prefill (the Oracle's from the
        FullKV answer)."""
        shared, unit.scored = unit.shared, {}
        for method in dict.fromkeys(m for m, _ in unit.todo if m != "fullkv" and m not in unit.streams):
            if method == "oracle":
                start = clock(shared.ids.device)
                scores = answer_importance(
                    self.model, shared.cache, shared.prompt_len, unit.appended, unit.full["answer_ids"]
                )
                seconds = clock(shared.ids.device) - start
            else:
                scores, seconds = self._press_scores(method, shared)
            unit.scored[method] = unit.full_scored(scores, seconds)

    def _method_row(
        self,
        task: Task,
        unit: _Unit,
        method: str,
        budget: int | float | None,
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
        budget: int | float | None,
        task: Task,
        unit: _Unit,
        settles: bool = True,
    ) -> AnswerRequest:
        """An answer to decode from ``scored`` evicted to ``budget``; it ends once the task's score is settled
        (``settles`` and :attr:`Task.settles_at_full_score`)."""
        settled = None
        if settles and task.settles_at_full_score:
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
        )
        start = clock(shared.ids.device)
        scores = self.compressors[method].press.score(ctx)
        return scores, clock(shared.ids.device) - start

    def _generate(
        self, compressor: Compressor, scored: ScoredPrompt, budget: int | float | None, unit: _Unit
    ) -> Generation:
        """One answer at batch 1 through the Compressor (decode-time policies act on the cache as it grows)."""
        compressed = compressor.evict(scored, budget)
        if unit.appended:
            return compressor.answer(compressed, unit.appended, unit.sampling)
        return compressor.decode(compressed, unit.sampling)

    def _generate_streamed(self, method: str, unit: _Unit, budget: int | float) -> Generation:
        """Compress ``unit``'s prompt to ``budget`` with layer-streamed eviction (its own prefill), then answer."""
        compressor = Compressor(
            self.model, self.tokenizer, self.compressors[method].press, budget, streamed=True
        )
        ids = torch.tensor([unit.prompt], device=self.full.device)
        return compressor.generate(ids, unit.sampling, unit.appended or None)

    def _row(
        self,
        task: Task,
        sample: Sample,
        setting: str,
        method: str,
        budget: int | float | None,
        gen: Generation,
        reference: str,
        score_s: float,
    ) -> dict[str, Any]:
        metrics = task.score(gen.text, sample, reference if task.needs_reference else None)
        if method != "fullkv":
            metrics["fullkv_f1"] = answer_agreement(gen.text, reference)  # agreement with FullKV, every task
        return {
            "task": task.name,
            "sample": sample.id,
            "method": method,
            "budget": budget_key(method, budget),
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
        }

    # --- importance quality -------------------------------------------------------------------------------

    def _importance(self, task: ImportanceTask) -> None:
        task.check_model(model_signature(self.model, self.tokenizer, "evaluated model"))
        methods = [m for m in self.methods if m not in NOT_RANKED]
        labels = task.samples(self.tokenizer)  # lazily: each holds a (layers, kv_heads, S) target
        for label in tqdm(labels, desc="eval importance", unit="prompt", disable=not self.progress):
            todo = [
                m for m in methods if (task.name, label.id, m, NO_BUDGET, "aware") not in self.results.done
            ]
            if not todo:
                continue
            ids = torch.tensor([label.prompt_ids], device=self.full.device)
            presses = {m: self.compressors[m].press for m in todo}
            shared = shared_prefill(self.model, ids, presses)
            target = label.target
            if target is None:  # a responses-only folder: the ground truth from this same prefill
                response = torch.tensor([label.response_ids], device=self.full.device)
                target = response_importance(self.model, shared.cache, shared.prompt_len, response).cpu()
            for method in todo:
                scores, seconds = self._press_scores(method, shared)
                scores = scores[0]
                metrics = task.score(with_protected(scores, presses[method]).cpu(), target)
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
        methods = [m for m in self.methods if m not in NOT_RANKED or m == "oracle"]
        samples = task.samples(self.tokenizer)
        for sample in tqdm(samples, desc=f"eval {task.name}", unit="prompt", disable=not self.progress):
            todo = [
                (m, b)
                for m in methods
                for b in self.budgets
                if (task.name, sample.id, m, budget_key(m, b), "aware") not in self.results.done
            ]
            if not todo:
                continue
            context, question = encode_sample(sample, self.tokenizer)
            positions = value_positions(sample, self.tokenizer)
            ids = torch.tensor([context + question], device=self.full.device)
            scored = {m: self.compressors[m].press for m, _ in todo if m != "oracle"}
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
            if "oracle" in dict(todo):
                response = torch.tensor([answer], device=ids.device)
                oracle = response_importance(self.model, shared.cache, shared.prompt_len, response)
                scores["oracle"] = (oracle[None], clock(ids.device) - start)
            for method, budget in todo:
                share = kept_share(self.compressors[method].select(scores[method][0], budget), positions)
                metrics = share_metrics(share)
                self.results.add(
                    {
                        "task": task.name,
                        "sample": sample.id,
                        "method": method,
                        "budget": budget_key(method, budget),
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
