"""Several questions about one context, the question-agnostic protocol of a chat or agent server (kvpress's
default): the context is compressed once, before any question is known, and then asked ``questions`` times.

Each context is a window of the held-out essays with ``questions`` facts planted at different depths: the
context is cut into ``questions`` equal strata and each fact goes in its own stratum (in a shuffled order), so
the facts spread from the start of the context to its end. A fact is one of :data:`FACT_KINDS`:

- a needle of a fact format of :mod:`lkv.labels.facts` (``passphrase``, ``date``, ``name``, ``letter_code``,
  ``magic_number``), keyed by a name of :data:`~lkv.labels.facts.EVAL_KEYS` and asked with one of its
  format's questions;
- ``multikey``: RULER's ``niah_multikey_1`` needle (a magic number for a two-word key) with three distractor
  needles of the same wording and other keys, placed anywhere in the context; one key is asked for;
- ``variable_tracking``: a RULER variable-tracking chain (:func:`lkv.eval.tasks.ruler.variable_chains`), its
  assignments in order inside the fact's stratum; asked for every variable that holds the first value.

The facts' kinds cycle through ``kinds`` across the contexts (context ``i``'s question ``j`` is of kind
``kinds[(i * questions + j) % len(kinds)]``), so every kind is asked about equally often. A :class:`Sample` is one
question: the samples of a context share its ``context`` text and ``meta["context_id"]`` and follow each
other; ``meta`` also records the question's index, its fact kind, the fact's depth and its measured
``distance``: the context tokens after the one holding the last character of the fact's first statement (for a
chain: its first assignment, the farthest back of its lines), i.e. how far from the end of the compressed
context the answer starts. The score is RULER's ``string_match_all``.

``lkv eval`` runs such a task with :func:`lkv.eval.run_multi_question.run_multi_question` (compress once, ask
each question on its own copy) and only in the question-agnostic setting: question-aware compression needs one
question, and a context has several.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lkv.eval.prompt_settings import Setting
from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.generalise import context_distance
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.ruler import (
    NIAH_NEEDLE,
    VT_ANSWER_PREFIX,
    VT_QUESTION,
    niah_wording,
    variable_chains,
)
from lkv.eval.tasks.text import HeldoutEssays, insert_at_depths, rng_for
from lkv.labels.facts import EVAL_KEYS, distinct_values, fact_format
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NEEDLE_KINDS = ("passphrase", "date", "name", "letter_code", "magic_number")
FACT_KINDS = (*NEEDLE_KINDS, "multikey", "variable_tracking")
DEFAULT_KINDS = ("passphrase", "multikey", "variable_tracking", "date", "name", "letter_code")
INTRO = (
    "The following text hides several facts: special values, magic numbers and chains of variable "
    "assignment. Memorize them; you will be asked about them afterwards."
)
MULTIKEY_DISTRACTORS = 3  # niah_multikey_1: four keys, one asked
VT_HOPS = 4  # RULER's default


@dataclass
class Fact:
    """One planted fact: its statements (inserted at ``depths``, the first one's the fact's depth), the question
    about it, what answers it and the answer's opening (RULER's prefix, or none)."""

    kind: str
    statements: list[str]
    depths: list[float]
    question: str
    answers: list[str]
    answer_prefix: str = ""


class MultiQuestionTask(GeneratedTask):
    """Contexts of held-out essays, each with ``questions`` facts asked one after another.

    Samples: per length, ``num_samples`` contexts × ``questions`` questions (one :class:`Sample` each, in
    question order).

    Args:
        lengths: haystack sizes in tokens (the planted statements come on top).
        questions: questions (and facts) per context, at least 2.
        num_samples: contexts per length.
        kinds: fact kinds (:data:`FACT_KINDS`), cycled through; default :data:`DEFAULT_KINDS`.
        answer_slack: tokens generated beyond the answer's own length.
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    name = "multi_question"
    metric = "string_match"
    settles_at_full_score = True  # string_match_all: a found value stays found
    supported_settings: tuple[Setting, ...] = ("agnostic",)

    def __init__(
        self,
        lengths: tuple[int, ...] = (1536,),
        questions: int = 4,
        num_samples: int = 4,
        kinds: tuple[str, ...] | None = None,
        answer_slack: int = 16,
        seed: int = 0,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        if questions < 2:
            raise ValueError(
                f"questions must be at least 2 (one context, several questions), got {questions}"
            )
        kinds = tuple(kinds or DEFAULT_KINDS)
        unknown = [k for k in kinds if k not in FACT_KINDS]
        if unknown or not kinds:
            raise ValueError(f"kinds: unknown fact kinds {unknown}; choose from {', '.join(FACT_KINDS)}")
        if answer_slack < 0:
            raise ValueError(f"answer_slack must be ≥ 0, got {answer_slack}")
        super().__init__(lengths, seed, heldout_fraction, num_samples=num_samples, questions=questions)
        self.kinds = kinds
        self.answer_slack = answer_slack
        self.essays_dir = essays_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        essays = HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction)
        out = []
        for length in self.lengths:
            for index in range(self.num_samples):
                out.extend(self._context(tokenizer, essays, length, index))
        return out

    def _context(
        self, tokenizer: PreTrainedTokenizerBase, essays: HeldoutEssays, length: int, index: int
    ) -> list[Sample]:
        """The ``questions`` samples of context ``index`` at ``length``."""
        rng = rng_for(self.name, self.seed, length, self.questions, index)
        strata = rng.sample(range(self.questions), self.questions)
        kinds = [self.kinds[(index * self.questions + j) % len(self.kinds)] for j in range(self.questions)]
        keys = iter(rng.sample(EVAL_KEYS, self.questions))
        facts = [
            _fact(kind, next(keys), rng, essays, stratum / self.questions, 1 / self.questions)
            for kind, stratum in zip(kinds, strata, strict=True)
        ]
        statements = [s for fact in facts for s in fact.statements]
        planted = sum(len(tokenizer(" " + s, add_special_tokens=False)["input_ids"]) for s in statements)
        window = essays.take(max(length - planted, 1), start=rng.randrange(len(essays.sentences)))
        # by depth: statements that land on one sentence boundary then keep their depths' order
        placed = sorted(zip((d for fact in facts for d in fact.depths), statements, strict=True))
        body = insert_at_depths(window, [s for _, s in placed], [d for d, _ in placed])
        context = f"{INTRO}\n{' '.join(body)}\n\n"
        context_id = f"{self.name}-L{length}-k{self.questions}-s{self.seed}-{index}"
        out = []
        for j, fact in enumerate(facts):
            sample = Sample(
                id=f"{context_id}-q{j}",
                context=context,
                question=fact.question,
                answers=fact.answers,
                answer_prefix=fact.answer_prefix,
            )
            answer_tokens = len(tokenizer(" ".join(fact.answers), add_special_tokens=False)["input_ids"])
            sample.max_new_tokens = answer_tokens + self.answer_slack
            sample.meta = {
                "context_id": context_id,
                "question_index": j,
                "questions": self.questions,
                "fact_kind": fact.kind,
                "length": length,
                "depth": round(fact.depths[0], 4),
                "distance": context_distance(sample, tokenizer, fact.statements[0])[1],
                "docs": sorted({s.doc_id for s in window}),
            }
            out.append(sample)
        return out

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}


def _fact(kind: str, key: str, rng: random.Random, essays: HeldoutEssays, start: float, width: float) -> Fact:
    """A fact of ``kind`` whose (first) statement lies in the depth stratum ``[start, start + width)``."""

    def depth() -> float:
        return start + width * rng.uniform(0.1, 0.9)

    if kind == "variable_tracking":
        (lines,), names = variable_chains(rng, 1, VT_HOPS)
        query = lines[0].rsplit("= ", 1)[1]
        return Fact(
            kind,
            lines,
            sorted(depth() for _ in lines),
            VT_QUESTION.format(query=query),
            names,
            VT_ANSWER_PREFIX.format(num_v=len(names), query=query),
        )
    if kind == "multikey":
        keys: list[str] = []
        while len(keys) < 1 + MULTIKEY_DISTRACTORS:
            candidate = f"{rng.choice(essays.words)}-{rng.choice(essays.words)}"
            if candidate not in keys:
                keys.append(candidate)
        values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), len(keys))]
        wording = niah_wording("numbers", singular=True)
        return Fact(
            kind,
            [NIAH_NEEDLE.format(kind="numbers", key=k, value=v) for k, v in zip(keys, values, strict=True)],
            [depth(), *(rng.random() for _ in range(MULTIKEY_DISTRACTORS))],
            wording["question"].format(query=keys[0]),
            values[:1],
            wording["answer_prefix"].format(query=keys[0]),
        )
    fmt = fact_format(kind)
    (value,) = distinct_values([fmt], rng)
    return Fact(
        kind,
        [fmt.statement.format(key=key, value=value)],
        [depth()],
        rng.choice(fmt.questions).format(key=key),
        [value],
    )
