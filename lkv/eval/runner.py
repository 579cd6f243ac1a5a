"""`lkv eval`: eviction methods × budgets × tasks × {question-aware, question-agnostic}, resumable, with reports.

    lkv eval --config configs/eval/niah.yaml --adapter runs/smollm2_135m/adapter

Per sample and setting the prompt is prefilled **once**: every method's prefill capture (SnapKV's window,
TOVA's last query, H2O's every query; identical ones shared) rides on that one forward pass, every method
scores the same cache, and each (method, budget) then gathers its kept entries and decodes. Up to
``batch_size`` (sample, setting) pairs go through together (fewer where prompts are long: ``max_batch_tokens``):
their answers are decoded in batches wherever the method's cache is fixed after eviction
(:mod:`lkv.eval.batched_decode`), and an answer of a string-match task stops once its score is settled
(:attr:`~lkv.eval.tasks.Task.settles_at_full_score`). At most the chunk's stacked full caches and one more
prompt's cache are held (:meth:`lkv.eval.run_end_task.EndTaskRun._run_chunk`). The FullKV answer of each prompt is decoded first: it
is the FullKV result, the reference of fidelity tasks, and the source of the Oracle's scores — the attention
its own answer tokens pay to the prompt (teacher-forced on the full cache, after the question in the
question-agnostic setting), i.e. s_GT of docs/design.md §1 for the answer actually given.

Settings (see :mod:`lkv.eval.tasks.base`): ``aware`` prefills context + question and compresses it all
(the paper's protocol); ``agnostic`` compresses the context alone, then appends the question to the
compressed cache. The tokens are identical, so the settings differ only in when compression happens.
A multi-question task (:mod:`lkv.eval.tasks.multi_question`) runs question-agnostic only: each context is
compressed once per (method, budget) and asked each of its questions from a copy (:mod:`lkv.eval.run_multi_question`).

Output folder::

    results.jsonl    one row per (task, sample, method, budget, setting), appended and flushed as it is made;
                     a rerun skips finished rows (:mod:`lkv.eval.results`)
    run.json         model, adapter fingerprint, method settings and chat-template variables; a rerun with other
                     ones is refused
    summary.csv, report.md, plots/*.png, tensorboard/   (see :mod:`lkv.eval.report`)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lkv.eval.run_end_task import EndTaskRun
from lkv.eval.run_importance import run_importance
from lkv.eval.run_multi_question import MultiQuestionRun
from lkv.eval.run_needle_tokens import run_needle_tokens
from lkv.eval.setup import EvalSetup
from lkv.eval.tasks import Benchmark, ImportanceTask, MultiQuestionTask, Task, check_settings
from lkv.eval.tasks.needle_tokens import NeedleTokenTask


def run_end_task(setup: EvalSetup, task: Task) -> None:
    """Every pending row of the end task ``task`` (:class:`~lkv.eval.run_end_task.EndTaskRun`)."""
    EndTaskRun(setup).run(task)


def run_multi_question(setup: EvalSetup, task: MultiQuestionTask) -> None:
    """Every pending row of the multi-question task ``task``: each context compressed once per (method,
    budget), then asked each question (:class:`~lkv.eval.run_multi_question.MultiQuestionRun`)."""
    MultiQuestionRun(setup).run(task)


#: benchmark kind → what runs it; a benchmark is run by the entry of the nearest class in its MRO
RUNS: dict[type[Benchmark], Callable[[EvalSetup, Any], None]] = {
    Task: run_end_task,
    ImportanceTask: run_importance,
    NeedleTokenTask: run_needle_tokens,
    MultiQuestionTask: run_multi_question,
}


def run_of(benchmark: Benchmark) -> Callable[[EvalSetup, Any], None]:
    """What runs ``benchmark``: the :data:`RUNS` entry of its class or the nearest base class that has one."""
    for kind in type(benchmark).__mro__:
        if kind in RUNS:
            return RUNS[kind]
    raise TypeError(f"{type(benchmark).__name__} is none of the benchmark kinds {[k.__name__ for k in RUNS]}")


class Evaluator(EvalSetup):
    """Runs benchmarks for a set of eviction methods on one model, appending rows to ``output/results.jsonl``
    (its arguments: :class:`~lkv.eval.setup.EvalSetup`)."""

    def run(self, benchmarks: Iterable[Benchmark]) -> list[dict[str, Any]]:
        """Run every benchmark (finished rows are skipped) and return all rows of the results file.

        Raises:
            ValueError: a benchmark cannot run in one of the settings (before anything runs).
        """
        benchmarks = list(benchmarks)
        check_settings(benchmarks, self.settings)
        for benchmark in benchmarks:
            run_of(benchmark)(self, benchmark)
        return self.results.rows
