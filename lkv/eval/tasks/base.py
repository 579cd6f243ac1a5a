"""What every end task gives the runner: samples split into a context and a question, and a scorer.

A :class:`Sample` is split where a question-agnostic system would see it: ``context`` is compressed before
the question is known, ``question`` (plus an optional ``answer_prefix``, the start of the assistant's turn)
comes after. Question-aware evaluation prefills exactly the same tokens in one go, so the two settings
differ only in *when* the cache is compressed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lkv.core.chat import chat_parts
from lkv.eval.prompt_settings import SETTINGS, Setting

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Sample:
    """One evaluation prompt.

    Attributes:
        id: unique within its task and stable across runs (it encodes the settings that made it), so a rerun
            skips finished samples.
        context: the long part (document, haystack, code), compressed in the question-agnostic setting.
        question: what is asked about it; appended after compression in the question-agnostic setting.
        answers: reference answers (empty when the reference is the FullKV answer, e.g. fidelity).
        max_new_tokens: longest answer generated.
        chat: wrap in the tokenizer's chat template (one user turn); False feeds raw text (LongBench's
            few-shot and code tasks).
        answer_prefix: text that starts the assistant's answer (RULER), after the chat template's opening.
        stop: strings that end the answer besides EOS.
        meta: task details recorded with each result (length, depth, ...).
    """

    id: str
    context: str
    question: str
    answers: list[str]
    max_new_tokens: int = 32
    chat: bool = True
    answer_prefix: str = ""
    stop: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


def encode_sample(
    sample: Sample, tokenizer: PreTrainedTokenizerBase, enable_thinking: bool = False
) -> tuple[list[int], list[int]]:
    """``(context_ids, question_ids)``; the prompt is their concatenation in both settings.

    With ``chat`` the context ids start with the chat template's opening and the question ids end with its
    closing (+ ``answer_prefix``), as :func:`lkv.core.chat.encode_context` / ``encode_question`` do, rendered
    with the template variable ``enable_thinking`` (off: Qwen3's closing holds an empty think block, as the
    labels' prompts do). Raw text gets the tokenizer's own special tokens (e.g. a BOS), as LongBench's
    ``pred.py`` tokenises it.
    """
    prefix, suffix = chat_parts(tokenizer, enable_thinking) if sample.chat else ("", "")
    context = tokenizer(prefix + sample.context, add_special_tokens=not sample.chat)["input_ids"]
    question = tokenizer(sample.question + suffix + sample.answer_prefix, add_special_tokens=False)[
        "input_ids"
    ]
    if not context or not question:
        raise ValueError(f"sample {sample.id}: context and question must both be non-empty")
    return list(context), list(question)


class Benchmark(ABC):
    """Anything ``lkv eval`` runs: an end :class:`Task` or :class:`~lkv.eval.tasks.importance.ImportanceTask`.

    ``name`` is the task column of the results; ``metric`` names the main score. Constructor arguments are
    the settings (the ``init_args`` of an eval config).
    """

    name: str = "benchmark"
    metric: str = "score"
    #: the prompt settings it can run in (``lkv eval`` refuses the others before running anything)
    supported_settings: tuple[Setting, ...] = SETTINGS
    #: the one setting its rows run in whatever the run's settings (a ranked task scores each label's own
    #: prompt, question included); None: every setting of the run
    fixed_setting: Setting | None = None

    @abstractmethod
    def samples(self, tokenizer: PreTrainedTokenizerBase) -> Iterable[Any]:
        """The benchmark's items in a fixed order (the tokenizer measures lengths in tokens)."""


def settings_run(benchmarks: Iterable[Benchmark], settings: Iterable[Setting]) -> list[Setting]:
    """The prompt settings that rows of ``benchmarks`` are run in when the run asks for ``settings``, in
    :data:`~lkv.eval.prompt_settings.SETTINGS` order."""
    settings = list(settings)
    used = {s for b in benchmarks for s in ([b.fixed_setting] if b.fixed_setting else settings)}
    return [s for s in SETTINGS if s in used]


def check_settings(benchmarks: Iterable[Benchmark], settings: Iterable[str]) -> None:
    """Refuse a run of a benchmark in a prompt setting it cannot run in (:attr:`Benchmark.supported_settings`).

    Raises:
        ValueError: naming the task, the settings it runs in and those refused.
    """
    settings = list(settings)
    for benchmark in benchmarks:
        refused = [s for s in settings if s not in benchmark.supported_settings]
        if refused:
            supported = ", ".join(benchmark.supported_settings)
            raise ValueError(
                f"task {benchmark.name}: runs only in the {supported} setting, not {', '.join(refused)} "
                f"(give settings: [{supported}])"
            )


class Task(Benchmark):
    """An end task: builds :class:`Sample` objects and scores an answer."""

    #: True when the reference is the FullKV answer of the same sample and setting (fidelity tasks).
    needs_reference: bool = False
    #: True when the main score can only grow as the answer grows and 1 is its maximum (a reference found
    #: anywhere in the text: RULER's ``string_match_all``). Once an answer scores 1 no further token can change
    #: its score, so ``lkv eval`` stops decoding it there instead of at ``max_new_tokens``.
    settles_at_full_score: bool = False

    @abstractmethod
    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        """Every sample of the task, in a fixed order."""

    @abstractmethod
    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        """Metrics of one answer; the key :attr:`metric` is the main score, in ``[0, 1]``.

        Args:
            reference: the FullKV answer to the same sample and setting (given when ``needs_reference``).
        """


class GeneratedTask(Task):
    """An end task generated from held-out text: the settings every such task shares, checked in one place.

    Subclasses keep their own typed signatures (what an eval config's ``init_args`` name, and what
    ``lkv eval --help`` lists) and hand the shared settings here.

    Args:
        lengths: prompt lengths in tokens.
        seed: base seed of the samples' draws.
        heldout_fraction: the train/held-out split of the training prompts (samples come from held-out text).
        max_new_tokens: longest answer.
        depths: positions of the planted fact in ``[0, 1]``, for tasks that plant one.
        counts: positive sample counts by setting name (``num_samples``, ``samples_per_cell``).
    """

    def __init__(
        self,
        lengths: tuple[int, ...],
        seed: int,
        heldout_fraction: float,
        max_new_tokens: int | None = None,
        depths: tuple[float, ...] | None = None,
        **counts: int,
    ) -> None:
        if not lengths or any(n <= 0 for n in lengths):
            raise ValueError(f"lengths must be positive token counts, got {tuple(lengths)}")
        if depths is not None and (not depths or any(not 0.0 <= d <= 1.0 for d in depths)):
            raise ValueError(f"depths must lie in [0, 1], got {tuple(depths)}")
        for name, value in counts.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
            setattr(self, name, value)
        self.lengths = tuple(lengths)
        self.depths = None if depths is None else tuple(depths)
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.heldout_fraction = heldout_fraction
