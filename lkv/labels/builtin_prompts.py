"""Built-in prompts: instructions over windows of the embedded essays and standard-library modules.

A reproducible mix of families (summaries, questions, extraction, code questions, the extra instruction
families of :mod:`lkv.labels.instructions` and ``find_value`` facts of :mod:`lkv.labels.facts`) drawn from
the train or held-out side of :func:`lkv.labels.prompts.split_by_document`.
"""

from __future__ import annotations

import math
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lkv.labels.facts import TRAIN_KEYS, training_formats
from lkv.labels.instructions import CODE_FAMILIES, FAMILIES, PROSE_FAMILIES, applies, write_instruction
from lkv.labels.prompts import (
    DEFAULT_HELDOUT_FRACTION,
    ESSAY_SOURCE,
    STDLIB_SOURCE,
    Prompt,
    PromptSource,
    check_passage_counts,
    essay_documents,
    prompt_id,
    split_by_document,
    stdlib_documents,
)

#: The ``find_value`` fact formats of the default mix (:mod:`lkv.labels.facts`).
DEFAULT_FACT_FORMATS = ("magic_number", "passcode", "vault_code")

_PROSE_INTROS = ("", "Read the following essay excerpt.", "Here is a passage from an essay by Paul Graham.")
_CODE_INTROS = (
    "",
    "The following code is from the Python standard library module `{module}`.",
    "Here is an excerpt of `{module}`:",
)
_FAMILIES = {ESSAY_SOURCE: PROSE_FAMILIES, STDLIB_SOURCE: CODE_FAMILIES}
# A sentence ends at . ! or ? (plus closing quotes/brackets) before a space, the end, or a capital letter:
# the essays' paragraph breaks were lost in packaging, leaving "accelerating.We".
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$|[A-Z\[])")


@dataclass
class _Document:
    """A document cut into units: sentences (prose) or lines (code)."""

    doc_id: str
    units: list[str]
    starts: list[int]  # unit indices a passage may start at
    cumulative: list[int]  # cumulative[i] = words in units[:i]


class BuiltinPrompts(PromptSource):
    """Prompts over Paul Graham essays and Python standard-library source, with varied instructions.

    Each prompt is one passage (a run of whole sentences, or whole lines starting at a top-level
    statement) of one document in the chosen split, with an instruction from one of five families:
    ``summarize``, ``question`` and ``extract`` for prose, ``code`` and ``extract`` for code, and
    ``find_value`` for both, where a synthetic fact ("The special magic number for maple is 7321945.")
    is inserted at a random depth and asked for (``answer`` holds the number).

    ``family_weights`` opens the mix to the families of :mod:`lkv.labels.instructions` (``title``,
    ``keywords``, ``quote``, ``continue`` for prose; ``title``, ``keywords``, ``locate``, ``review`` for
    code) with relative weights; ``fact_formats`` picks the ``find_value`` facts among the ``train`` formats
    of :mod:`lkv.labels.facts`. Evaluation-only formats (passphrases, dates, names, letter codes, reworded
    questions) and the evaluation-only haystack (``pydoc_data``) are refused.

    Prompt ``i`` depends only on ``seed``, ``i`` and the settings, so a longer run extends a shorter one.

    Args:
        split: documents to draw from; the two splits never share a document.
        num_prompts: prompts per iteration.
        min_words: shortest passage, in whitespace-separated words (≈1.3 tokens each in prose, 2–3 in
            code); documents shorter than this are not used.
        max_words: longest passage; each prompt draws its length uniformly in ``[min_words, max_words]``.
        code_fraction: share of prompts drawn from standard-library source.
        retrieval_fraction: share of prompts that are ``find_value``.
        heldout_fraction: share of documents held out (see :func:`split_by_document`).
        seed: base seed.
        essays_dir: essay folder (``*.txt``); default: the cached embedded essays.
        stdlib_dir: Python source tree; default: the running interpreter's standard library.
        family_weights: relative weight of each instruction family among the prompts that are not
            ``find_value``, e.g. ``{summarize: 1, question: 2, quote: 2, locate: 1}``; a family is drawn
            only for the passages it applies to. Default: the original families, uniformly per source.
        fact_formats: ``find_value`` fact formats (``train`` side of :mod:`lkv.labels.facts`).
        fact_depths: ``(low, high)``: a ``find_value`` fact goes at a depth (share of the passage's units before
            it) drawn uniformly in this range; e.g. ``(0.0, 0.5)`` with long passages puts the answer far from
            the end of the prompt, the reach that prompts of ~1K tokens never show. Default: anywhere.
        distractor_facts: more facts of the asked one's format, each with another key and value, at random
            depths of a ``find_value`` passage: only the question tells which value is asked for, so the
            labels teach a question-aware ranking what a per-token one cannot learn. Default: none.
    """

    def __init__(
        self,
        split: Literal["train", "heldout"] = "train",
        num_prompts: int = 64,
        min_words: int = 200,
        max_words: int = 800,
        code_fraction: float = 0.25,
        retrieval_fraction: float = 0.3,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
        seed: int = 0,
        essays_dir: str | None = None,
        stdlib_dir: str | None = None,
        family_weights: dict[str, float] | None = None,
        fact_formats: tuple[str, ...] = DEFAULT_FACT_FORMATS,
        fact_depths: tuple[float, float] = (0.0, 1.0),
        distractor_facts: int = 0,
    ) -> None:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        check_passage_counts(num_prompts, min_words, max_words)
        for name, value in (
            ("code_fraction", code_fraction),
            ("retrieval_fraction", retrieval_fraction),
            ("heldout_fraction", heldout_fraction),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.split = split
        self.num_prompts = num_prompts
        self.min_words = min_words
        self.max_words = max_words
        self.code_fraction = code_fraction
        self.retrieval_fraction = retrieval_fraction
        self.heldout_fraction = heldout_fraction
        self.seed = seed
        self.essays_dir = essays_dir
        self.stdlib_dir = stdlib_dir
        self.family_weights = _check_weights(family_weights, code_fraction)
        self._facts = training_formats(fact_formats)
        self.fact_formats = tuple(fact_formats)
        low, high = fact_depths
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(
                f"fact_depths must be (low, high) with 0 ≤ low ≤ high ≤ 1, got {tuple(fact_depths)}"
            )
        self.fact_depths = (float(low), float(high))
        if not 0 <= distractor_facts < len(TRAIN_KEYS):
            raise ValueError(
                f"distractor_facts must be in [0, {len(TRAIN_KEYS) - 1}], got {distractor_facts}"
            )
        self.distractor_facts = distractor_facts
        self._pools: dict[str, list[_Document]] | None = None

    count_setting = "num_prompts"

    def __len__(self) -> int:
        return self.num_prompts

    def __iter__(self) -> Iterator[Prompt]:
        pools = self._load_pools()
        for index in range(self.num_prompts):
            yield self._prompt(index, random.Random(f"lkv-builtin:{self.seed}:{index}"), pools)

    def describe(self) -> str:
        return (
            f"BuiltinPrompts(split={self.split}, num_prompts={self.num_prompts}, "
            f"words={self.min_words}..{self.max_words}, code_fraction={self.code_fraction}, "
            f"retrieval_fraction={self.retrieval_fraction}, heldout_fraction={self.heldout_fraction}, "
            f"seed={self.seed}, stdlib=python{sys.version_info.major}.{sys.version_info.minor}"
            + ("" if self.family_weights is None else f", family_weights={self.family_weights}")
            + (
                ""
                if self.fact_formats == DEFAULT_FACT_FORMATS
                else f", fact_formats={list(self.fact_formats)}"
            )
            + ("" if self.fact_depths == (0.0, 1.0) else f", fact_depths={list(self.fact_depths)}")
            + ("" if not self.distractor_facts else f", distractor_facts={self.distractor_facts}")
            + ")"
        )

    def _load_pools(self) -> dict[str, list[_Document]]:
        """Documents of this split, cut into units, per source (read once, on first iteration)."""
        if self._pools is None:
            self._pools = {}
            if self.code_fraction < 1.0:
                self._pools[ESSAY_SOURCE] = self._pool(ESSAY_SOURCE, essay_documents(self.essays_dir))
            if self.code_fraction > 0.0:
                self._pools[STDLIB_SOURCE] = self._pool(STDLIB_SOURCE, stdlib_documents(self.stdlib_dir))
        return self._pools

    def _pool(self, source: str, files: dict[str, Path]) -> list[_Document]:
        train, heldout = split_by_document(list(files), self.heldout_fraction)
        chosen = sorted(heldout if self.split == "heldout" else train)
        pool = []
        for doc_id in chosen:
            try:
                text = files[doc_id].read_text(encoding="utf-8")
            except UnicodeDecodeError:  # a few stdlib test fixtures are deliberately not UTF-8
                continue
            document = _cut_code(doc_id, text) if source == STDLIB_SOURCE else _cut_prose(doc_id, text)
            if document.cumulative[-1] >= self.min_words:
                pool.append(document)
        if not pool:
            raise ValueError(
                f"no {source} document of at least min_words={self.min_words} words in the {self.split!r} "
                f"split ({len(chosen)} of {len(files)} documents; heldout_fraction={self.heldout_fraction})"
            )
        return pool

    def _prompt(self, index: int, rng: random.Random, pools: dict[str, list[_Document]]) -> Prompt:
        source = STDLIB_SOURCE if rng.random() < self.code_fraction else ESSAY_SOURCE
        document = rng.choice(pools[source])
        units = _window(document, rng.randint(self.min_words, self.max_words), rng)
        code = source == STDLIB_SOURCE
        answer = None
        meta: dict[str, Any] = {}
        if rng.random() < self.retrieval_fraction:
            kind = "find_value"
            fact = rng.choice(self._facts)
            key = rng.choice(TRAIN_KEYS)
            value = fact.value(rng)
            if self.fact_depths == (0.0, 1.0):
                depth = rng.randint(0, len(units))  # the draw every default prompt was made with
            else:
                low = math.ceil(self.fact_depths[0] * len(units))
                depth = rng.randint(low, max(low, math.floor(self.fact_depths[1] * len(units))))
            evidence = fact.statement.format(key=key, value=value)
            units.insert(depth, _as_unit(evidence, units, depth, code))
            if self.distractor_facts:  # no draws without them: a default prompt keeps its draws
                keys = rng.sample([k for k in TRAIN_KEYS if k != key], self.distractor_facts)
                for other in keys:
                    other_value = fact.value(rng)
                    while other_value == value:
                        other_value = fact.value(rng)
                    at = rng.randint(0, len(units))
                    units.insert(
                        at, _as_unit(fact.statement.format(key=other, value=other_value), units, at, code)
                    )
                    depth += at <= depth  # the asked fact moved one unit down
                meta["distractors"] = self.distractor_facts
            instruction = rng.choice(fact.questions).format(key=key)
            answer = value
            meta["depth"] = round(depth / (len(units) - 1), 4)
            meta["evidence"] = evidence  # the sentence stating the answer (`lkv label --gold_answers`)
        else:
            kind = self._family(source, rng)
            instruction = write_instruction(kind, "".join(units) if code else " ".join(units), code, rng)
        passage = "".join(units).rstrip() if code else " ".join(units)
        meta["words"] = len(passage.split())
        if code:
            module = document.doc_id.removeprefix(f"{STDLIB_SOURCE}/").removesuffix(".py").replace("/", ".")
            intro = rng.choice(_CODE_INTROS).format(module=module)
            passage = f"```python\n{passage}\n```"
        else:
            intro = rng.choice(_PROSE_INTROS)
        # Mostly question-after-context (what LookaheadKV must anticipate), sometimes instruction first.
        if rng.random() < 0.2:
            parts = [instruction, intro, passage]
        else:
            parts = [intro, passage, instruction]
            meta["question"] = instruction  # the trailing question: question-agnostic labels cut here
        messages = [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]
        return Prompt(
            id=prompt_id(f"builtin-{self.split}-s{self.seed}", index, messages),
            messages=messages,
            source=source,
            doc_id=document.doc_id,
            kind=kind,
            answer=answer,
            meta=meta,
        )

    def _family(self, source: str, rng: random.Random) -> str:
        """An instruction family for a passage of ``source``, by ``family_weights`` (default: uniform over
        the original families, drawn exactly as before the weights existed)."""
        if self.family_weights is None:
            return rng.choice(_FAMILIES[source])
        names = [
            f
            for f in self.family_weights
            if applies(f, source == STDLIB_SOURCE) and self.family_weights[f] > 0
        ]
        return rng.choices(names, weights=[self.family_weights[f] for f in names])[0]


def _check_weights(weights: dict[str, float] | None, code_fraction: float) -> dict[str, float] | None:
    """``family_weights`` validated: known families, weights ≥ 0, a positive one for every source in use."""
    if weights is None:
        return None
    known = set(FAMILIES)
    unknown = sorted(set(weights) - known)
    if unknown:
        raise ValueError(f"family_weights: unknown families {unknown}; choose from {sorted(known)}")
    negative = sorted(f for f, w in weights.items() if not w >= 0)
    if negative:
        raise ValueError(f"family_weights: weights must be ≥ 0, got { ({f: weights[f] for f in negative}) }")
    used = [s for s, on in ((ESSAY_SOURCE, code_fraction < 1.0), (STDLIB_SOURCE, code_fraction > 0.0)) if on]
    for source in used:
        if not any(w > 0 and applies(f, source == STDLIB_SOURCE) for f, w in weights.items()):
            raise ValueError(
                f"family_weights gives no positive weight to a family that applies to {source} passages "
                f"(code_fraction={code_fraction}); e.g. add {_FAMILIES[source][0]!r}"
            )
    return dict(weights)


def _cut_prose(doc_id: str, text: str) -> _Document:
    flat = " ".join(text.split())
    bounds = [0, *(m.end() for m in _SENTENCE_END.finditer(flat)), len(flat)]
    pieces = (flat[a:b].strip() for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    sentences = [s for s in pieces if s]
    return _document(doc_id, sentences, list(range(len(sentences))))


def _cut_code(doc_id: str, text: str) -> _Document:
    lines = [line + "\n" for line in text.splitlines()]  # every line ends in \n, even the file's last
    # Start at a top-level block after a blank line, so a passage begins with a whole definition,
    # decorator, comment block or import group.
    starts = [
        i
        for i, line in enumerate(lines)
        if (line[:1].isalpha() or line.startswith(("@", "#"))) and (i == 0 or not lines[i - 1].strip())
    ]
    return _document(doc_id, lines, starts or [0])


def _document(doc_id: str, units: list[str], starts: list[int]) -> _Document:
    cumulative = [0]
    for unit in units:
        cumulative.append(cumulative[-1] + len(unit.split()))
    return _Document(doc_id, units, starts, cumulative)


def _window(document: _Document, target_words: int, rng: random.Random) -> list[str]:
    """Whole units from a random start until ``target_words`` words (or the document's end)."""
    total = document.cumulative[-1]
    fitting = [s for s in document.starts if total - document.cumulative[s] >= target_words]
    start = rng.choice(fitting) if fitting else document.starts[0]
    stop = start + 1
    while (
        stop < len(document.units) and document.cumulative[stop] - document.cumulative[start] < target_words
    ):
        stop += 1
    return document.units[start:stop]


def _as_unit(fact: str, units: list[str], position: int, code: bool) -> str:
    """The inserted fact as a sentence, or as a comment line indented like the code line it precedes."""
    if not code:
        return fact
    neighbour = units[position] if position < len(units) else units[-1]
    indent = neighbour[: len(neighbour) - len(neighbour.lstrip())] if neighbour.strip() else ""
    return f"{indent}# {fact}\n"
