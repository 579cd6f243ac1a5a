"""Benchmarks for ``lkv eval``: generated end tasks on held-out text, LongBench, and importance quality.

``make_task("niah", lengths=[1024])`` builds a benchmark by name; :data:`TASKS` lists them. In an eval
config each entry of ``tasks`` is ``{class_path: lkv.eval.tasks.NeedleTask, init_args: {...}}``.
"""

from __future__ import annotations

from lkv.eval.tasks.base import Benchmark, Sample, Task, check_settings, encode_sample, settings_run
from lkv.eval.tasks.code import CodeCompletionTask
from lkv.eval.tasks.code_lookup import CodeLookupTask
from lkv.eval.tasks.fidelity import FidelityTask
from lkv.eval.tasks.generalise import GeneraliseTask
from lkv.eval.tasks.importance import ImportanceTask
from lkv.eval.tasks.longbench import LongBenchTask
from lkv.eval.tasks.multi_question import MultiQuestionTask
from lkv.eval.tasks.needle import NeedleTask
from lkv.eval.tasks.needle_families import NeedleFamilyTask
from lkv.eval.tasks.needle_tokens import NeedleTokenTask
from lkv.eval.tasks.ruler import RulerTask

TASKS: dict[str, type[Benchmark]] = {
    "niah": NeedleTask,
    "needle_families": NeedleFamilyTask,
    "needle_tokens": NeedleTokenTask,
    "ruler": RulerTask,
    "code": CodeCompletionTask,
    "code_lookup": CodeLookupTask,
    "fidelity": FidelityTask,
    "generalise": GeneraliseTask,
    "importance": ImportanceTask,
    "longbench": LongBenchTask,
    "multi_question": MultiQuestionTask,
}


def make_task(name: str, **kwargs) -> Benchmark:
    """Instantiate the benchmark registered as ``name`` (see :data:`TASKS`) with its settings."""
    try:
        cls = TASKS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(TASKS)}") from None
    return cls(**kwargs)


__all__ = [
    "TASKS",
    "Benchmark",
    "CodeCompletionTask",
    "CodeLookupTask",
    "FidelityTask",
    "GeneraliseTask",
    "ImportanceTask",
    "LongBenchTask",
    "MultiQuestionTask",
    "NeedleFamilyTask",
    "NeedleTask",
    "NeedleTokenTask",
    "RulerTask",
    "Sample",
    "Task",
    "check_settings",
    "settings_run",
    "encode_sample",
    "make_task",
]
