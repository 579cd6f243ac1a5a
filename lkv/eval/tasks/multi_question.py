"""Several questions about one context, the question-agnostic protocol of a chat or agent server (kvpress's
default): the context is compressed once, before any question is known, and then asked ``questions`` times.

Each context is a window of the held-out essays (or of the held-out documents of any text source of
:mod:`lkv.labels.sources`, your own folder included) with ``questions`` facts planted at different depths: the
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
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lkv.eval.prompt_settings import Setting
from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.generalise import SOURCE_GROUPS, context_distance
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.ruler import (
    NIAH_NEEDLE,
    VT_ANSWER_PREFIX,
    VT_QUESTION,
    niah_wording,
    variable_chains,
)
from lkv.eval.tasks.text import (
    HeldoutEssays,
    Sentence,
    SplitUnits,
    corpus_words,
    insert_at_depths,
    rng_for,
    source_haystack,
)
from lkv.labels.facts import EVAL_KEYS, distinct_values, fact_format
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION
from lkv.labels.sources import Split, TextSource, evaluation_split, known_sources, make_source, source_roots

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
    """Contexts of held-out essays (or text sources), each with ``questions`` facts asked one after another.

    Samples: per source (or the essays) and length, ``num_samples`` contexts × ``questions`` questions (one
    :class:`Sample` each, in question order).

    Args:
        lengths: haystack sizes in tokens (the planted statements come on top).
        questions: questions (and facts) per context, at least 2.
        num_samples: contexts per length.
        kinds: fact kinds (:data:`FACT_KINDS`), cycled through; default :data:`DEFAULT_KINDS`.
        answer_slack: tokens generated beyond the answer's own length.
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
        sources: text sources (:data:`lkv.labels.sources.SOURCES`) to draw the haystacks from instead of the
            held-out essays, ``num_samples`` contexts per source and length; ``text-folder`` is your own
            documents (its folder in ``roots``).
        split: the sources' documents to draw from: ``heldout`` or ``dev``, never a source's ``train`` ones.
        roots: source name → folder to read it from instead of its usual place.
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
        sources: tuple[str, ...] | None = None,
        split: Literal["dev", "heldout"] = "heldout",
        roots: dict[str, str] | None = None,
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
        if sources is not None and not sources:
            raise ValueError(
                "sources: name at least one text source, or leave it out for the held-out essays"
            )
        super().__init__(lengths, seed, heldout_fraction, num_samples=num_samples, questions=questions)
        self.kinds = kinds
        self.answer_slack = answer_slack
        self.essays_dir = essays_dir
        self.sources = None if sources is None else known_sources(sources, "sources")
        self.split = evaluation_split(split)
        self.roots = source_roots(roots)

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        if self.sources is None:
            texts: list[_Haystacks] = [
                _EssayHaystacks(HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction))
            ]
        else:
            texts = [
                _SourceHaystacks(make_source(name, self.roots.get(name)), self.split, tokenizer)
                for name in self.sources
            ]
        out = []
        for text in texts:
            for length in self.lengths:
                for index in range(self.num_samples):
                    out.extend(self._context(tokenizer, text, length, index))
        return out

    def _context(
        self, tokenizer: PreTrainedTokenizerBase, text: _Haystacks, length: int, index: int
    ) -> list[Sample]:
        """The ``questions`` samples of context ``index`` at ``length`` in ``text``'s haystacks."""
        rng = rng_for(self.name, *text.seed_parts, self.seed, length, self.questions, index)
        strata = rng.sample(range(self.questions), self.questions)
        kinds = [self.kinds[(index * self.questions + j) % len(self.kinds)] for j in range(self.questions)]
        keys = iter(rng.sample(EVAL_KEYS, self.questions))
        facts = [
            _fact(kind, next(keys), rng, text.words, stratum / self.questions, 1 / self.questions)
            for kind, stratum in zip(kinds, strata, strict=True)
        ]
        statements = [s for fact in facts for s in fact.statements]
        planted = sum(len(tokenizer(" " + s, add_special_tokens=False)["input_ids"]) for s in statements)
        window = text.take(max(length - planted, 1), rng)
        # by depth: statements that land on one unit boundary then keep their depths' order
        placed = sorted(zip((d for fact in facts for d in fact.depths), statements, strict=True))
        body = insert_at_depths(window, [text.as_unit(s) for _, s in placed], [d for d, _ in placed])
        context = f"{INTRO}\n{text.join(body)}\n\n"
        context_id = "-".join(
            [self.name, *text.seed_parts, f"L{length}-k{self.questions}-s{self.seed}-{index}"]
        )
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
                **text.meta,
            }
            out.append(sample)
        return out

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}


def _fact(kind: str, key: str, rng: random.Random, words: list[str], start: float, width: float) -> Fact:
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
            candidate = f"{rng.choice(words)}-{rng.choice(words)}"
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


class _Haystacks(ABC):
    """Where a task's contexts come from: windows of text, the words multi-key facts are keyed by, and how a
    planted statement is written among its units."""

    seed_parts: tuple[str, ...]  # what names these haystacks in a context's id and random draws
    meta: dict[str, str]  # what a row records of them
    words: list[str]

    @abstractmethod
    def take(self, tokens: int, rng: random.Random) -> list[Sentence]:
        """A window of about ``tokens`` tokens."""

    def as_unit(self, statement: str) -> str:
        """``statement`` as one unit of this text."""
        return statement

    def join(self, units: list[str]) -> str:
        """Units back into running text."""
        return " ".join(units)


class _EssayHaystacks(_Haystacks):
    """The held-out essays: a window from a random sentence of their cyclic stream (context ids and draws as
    before sources existed, so earlier rows stay this task's)."""

    seed_parts = ()
    meta: dict[str, str] = {}

    def __init__(self, essays: HeldoutEssays) -> None:
        self.essays = essays
        self.words = essays.words

    def take(self, tokens: int, rng: random.Random) -> list[Sentence]:
        return self.essays.take(tokens, start=rng.randrange(len(self.essays.sentences)))


class _SourceHaystacks(_Haystacks):
    """A text source's ``split`` documents (:func:`lkv.eval.tasks.text.source_haystack`), planted statements
    written as its units (a line source's needle line)."""

    def __init__(self, source: TextSource, split: Split, tokenizer: PreTrainedTokenizerBase) -> None:
        self.source = source
        self.documents = SplitUnits(source, split)
        self.tokenizer = tokenizer
        self.seed_parts = (source.name, split)
        self.meta = {"source": source.name, "source_group": SOURCE_GROUPS[source.group], "split": split}
        self.words = corpus_words(doc.text for doc in source.documents(split))

    def take(self, tokens: int, rng: random.Random) -> list[Sentence]:
        window = source_haystack(self.documents, self.tokenizer, tokens, rng)
        if sum(unit.tokens for unit in window) < tokens:
            raise ValueError(
                f"text source {self.source.name}: its {self.seed_parts[1]!r} split holds fewer than the "
                f"{tokens} tokens a context needs"
            )
        return window

    def as_unit(self, statement: str) -> str:
        return self.source.as_unit(statement)

    def join(self, units: list[str]) -> str:
        return self.source.join(units)
