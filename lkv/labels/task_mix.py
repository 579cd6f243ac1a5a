"""A product training mix over every in-group text source, with task kinds modelled on the paper's.

LookaheadKV's paper trains on long-document questions (several per document), general instructions, code
and few-shot prompts. :class:`TaskMixPrompts` draws the same kinds from the ``train`` documents of the
in-group sources of :mod:`lkv.labels.sources`, with the ``train`` facts of :mod:`lkv.labels.facts` as the
answers a question can be checked on:

* ``doc_qa``: facts of varied kinds planted in the passage; the prompt asks one or several of them.
* ``distractor``: facts of one kind with different keys; the prompt asks one, so only the question tells
  which value matters.
* ``instruction``: an instruction family of :mod:`lkv.labels.instructions` (summaries, extraction, quotes,
  titles, ...) over the passage.
* ``code``: a code family (explain, locate, review, extract) over a passage of a code source.
* ``few_shot``: worked question/answer examples about facts of the passage, then the question.

Held-out sources (:func:`lkv.labels.sources.training_source`) and fact kinds off the ``train`` side
(:func:`lkv.labels.facts.training_formats`) are refused, so the generalisation evaluations stay unseen.
"""

from __future__ import annotations

import random
from typing import Any

from lkv.labels.facts import TRAIN_KEYS, FactFormat, formats
from lkv.labels.instructions import FAMILIES, applies, write_instruction
from lkv.labels.passage_prompts import PassagePrompts
from lkv.labels.prompts import STDLIB_SOURCE, Prompt, prompt_id
from lkv.labels.sources import IN_SOURCES, TextSource, draw_document, training_sources

#: The task kinds, in the order their weights are drawn.
TASKS = ("doc_qa", "distractor", "instruction", "code", "few_shot")
#: Default weights: the paper's shares (long-document QA 58%, instructions 23%, code 8%, few-shot 11% of ~86K
#: samples), its document questions split between ``doc_qa`` and ``distractor``.
DEFAULT_TASK_WEIGHTS = {
    "doc_qa": 0.43,
    "distractor": 0.15,
    "instruction": 0.23,
    "code": 0.08,
    "few_shot": 0.11,
}
#: Every ``train`` fact format.
TRAIN_FORMATS = tuple(f.name for f in formats("train"))

_MULTI_HEADERS = (
    "Answer each of these questions about the text:",
    "Using only the text above, answer the following questions, one line each:",
    "Please answer these questions from the passage:",
)
_FEW_SHOT_HEADERS = (
    "",
    "Answer the last question the way the examples are answered.",
    "Here are questions about the text with their answers. Answer the last one in the same way.",
)


class TaskMixPrompts(PassagePrompts):
    """Document questions, distractors, instructions, code questions and few-shot prompts over long passages.

    A passage is whole units (sentences or lines) of one ``train`` document from a random unit, of a length
    drawn uniformly in ``[min_words, max_words]`` words; a document shorter than that is continued by the next
    ``train`` documents of its source (by id, a blank line between two). Facts are planted at unit boundaries
    drawn uniformly over the whole passage, each with its own ``train`` key; a planted value appears in the
    prompt only where planted (redrawn while the passage, another value or a question contains it), so every
    asked value appears exactly once. The question (or instruction) follows the passage.

    Prompt ``i`` depends only on ``seed``, ``i`` and the settings: a longer run extends a shorter one.

    ``meta`` holds ``task``, ``question`` (the text after the passage), ``words`` (the passage's, facts
    included) and ``documents`` (the ids the passage spans); an instruction its ``family``; a fact-asking prompt
    ``answers`` (one ``{"answer", "evidence", "format", "depth"}`` per asked fact, in the order asked: what
    ``lkv label --gold_answers`` checks and teacher-forces, :mod:`lkv.labels.gold`), ``planted`` (facts in the
    passage) and, asking one, ``evidence``. ``answer`` is the asked values joined by ``"; "``.

    Args:
        sources: in-group sources of every task but ``code``; a held-out one is refused.
        code_sources: in-group sources of kind ``code`` for the ``code`` task (``c-headers`` is held out).
        min_words: shortest passage in whitespace-separated words (prose ≈ 1.3 tokens a word, code 2–3).
        task_weights: relative weight of each task of :data:`TASKS` (missing ones weigh 0); default
            :data:`DEFAULT_TASK_WEIGHTS`.
        fact_formats: ``train`` fact formats to plant (default: all of them).
        max_facts: most facts planted by ``doc_qa`` and ``distractor`` (each plants 2..max_facts;
            ``doc_qa`` asks 1..planted of them).
        max_shots: most worked examples of ``few_shot`` (it shows 1..max_shots).
        others: as :class:`~lkv.labels.passage_prompts.PassagePrompts`.
    """

    stream = "lkv-task-mix"
    described = (
        "sources",
        "code_sources",
        "num_prompts",
        "words",
        "task_weights",
        "fact_formats",
        "max_facts",
        "max_shots",
        "seed",
    )

    def __init__(
        self,
        sources: tuple[str, ...] = IN_SOURCES,
        code_sources: tuple[str, ...] = (STDLIB_SOURCE,),
        num_prompts: int = 64,
        min_words: int = 600,
        max_words: int = 5000,
        task_weights: dict[str, float] | None = None,
        fact_formats: tuple[str, ...] = TRAIN_FORMATS,
        max_facts: int = 4,
        max_shots: int = 3,
        seed: int = 0,
        roots: dict[str, str] | None = None,
    ) -> None:
        super().__init__(sources, num_prompts, min_words, max_words, fact_formats, seed, roots)
        if not 2 <= max_facts <= len(TRAIN_KEYS):
            raise ValueError(f"max_facts must be in [2, {len(TRAIN_KEYS)}], got {max_facts}")
        if not 1 <= max_shots < len(TRAIN_KEYS):
            raise ValueError(f"max_shots must be in [1, {len(TRAIN_KEYS) - 1}], got {max_shots}")
        self.task_weights = _check_weights(
            dict(DEFAULT_TASK_WEIGHTS if task_weights is None else task_weights)
        )
        self._code_sources: list[TextSource] = []
        if self.task_weights.get("code", 0) > 0:
            if not code_sources:
                raise ValueError(
                    "code_sources must name a code source while task_weights gives 'code' a weight"
                )
            self._code_sources = training_sources(tuple(code_sources), self.roots)
            prose = [s.name for s in self._code_sources if s.kind != "code"]
            if prose:
                raise ValueError(
                    f"code_sources: {prose} are not code sources (lkv.labels.sources kind 'code')"
                )
        self.code_sources = tuple(code_sources)
        self.max_facts = max_facts
        self.max_shots = max_shots

    def _drawn_sources(self) -> list[TextSource]:
        return self._sources + self._code_sources

    def _prompt(self, index: int, rng: random.Random, doc_ids: dict[str, list[str]]) -> Prompt:
        """A task drawn by :attr:`task_weights`, then its passage and question."""
        tasks = [t for t in TASKS if self.task_weights.get(t, 0) > 0]
        task = rng.choices(tasks, [self.task_weights[t] for t in tasks])[0]
        source = rng.choice(self._code_sources if task == "code" else self._sources)
        documents, segments = self._passage(source, doc_ids[source.name], rng)
        code = source.kind == "code"
        meta: dict[str, Any] = {"task": task, "documents": documents}
        answer = None
        if task in ("instruction", "code"):
            family = rng.choice([f for f in FAMILIES if applies(f, code)])
            question = write_instruction(family, _render(source, segments), code, rng)
            meta["family"] = family
        else:
            question, answer, segments = self._facts_task(task, source, segments, rng, meta)
        passage = _render(source, segments)
        meta["words"] = len(passage.split())
        meta["question"] = question
        if code:
            passage = f"```\n{passage}\n```"
        messages = [{"role": "user", "content": f"{passage}\n\n{question}"}]
        return Prompt(
            id=prompt_id(f"taskmix-s{self.seed}", index, messages),
            messages=messages,
            source=source.name,
            doc_id=documents[0],
            kind=task,
            answer=answer,
            meta=meta,
        )

    def _passage(
        self, source: TextSource, doc_ids: list[str], rng: random.Random
    ) -> tuple[list[str], list[list[str]]]:
        """``(document ids, units of each)``: a window of a drawn length from a random unit of a drawn document,
        continued by the next documents (by id) while it is short and the source has more."""
        target = rng.randint(self.min_words, self.max_words)
        doc_id, units = draw_document(source, doc_ids, rng)
        sizes = [len(unit.split()) for unit in units]
        remaining = sum(sizes)
        fitting = []
        for i, size in enumerate(sizes):  # starts that leave the whole window inside this document
            if remaining >= target:
                fitting.append(i)
            remaining -= size
        start = rng.choice(fitting) if fitting else 0
        documents, segments, words = [doc_id], [[]], 0
        position = doc_ids.index(doc_id)
        while True:
            for unit in units[start:]:
                if words >= target:
                    return documents, segments
                segments[-1].append(unit)
                words += len(unit.split())
            position = (position + 1) % len(doc_ids)
            if doc_ids[position] == documents[0] or words >= target:
                return documents, segments
            units, start = source.units(source.document(doc_ids[position]).text), 0
            if units:
                documents.append(doc_ids[position])
                segments.append([])

    def _facts_task(
        self,
        task: str,
        source: TextSource,
        segments: list[list[str]],
        rng: random.Random,
        meta: dict[str, Any],
    ) -> tuple[str, str, list[list[str]]]:
        """Plant the facts of a ``doc_qa``, ``distractor`` or ``few_shot`` prompt; its question, answer and
        planted passage (``meta`` gains ``answers``, ``planted`` and, for one asked fact, ``evidence``)."""
        if task == "few_shot":
            count = rng.randint(1, self.max_shots) + 1
            kinds = [rng.choice(self._facts) for _ in range(count)]
        elif task == "distractor":
            count = rng.randint(2, self.max_facts)
            kinds = [rng.choice(self._facts)] * count
        else:
            count = rng.randint(2, self.max_facts)
            kinds = [rng.choice(self._facts) for _ in range(count)]
        keys = rng.sample(TRAIN_KEYS, count)
        questions = [
            rng.choice(kind.questions).format(key=key) for kind, key in zip(kinds, keys, strict=True)
        ]
        prompt_text = [*questions, *(k.statement for k in kinds), *_MULTI_HEADERS, *_FEW_SHOT_HEADERS]
        fixed = " ".join([_render(source, segments), *prompt_text])
        values = _fresh_values(kinds, fixed, rng)
        statements = [
            kind.statement.format(key=key, value=value)
            for kind, key, value in zip(kinds, keys, values, strict=True)
        ]
        segments, depths = _plant(segments, [source.as_unit(s) for s in statements], rng)
        if task == "few_shot":
            chosen = [count - 1]
            header = rng.choice(_FEW_SHOT_HEADERS)
            shots = [f"Q: {questions[i]}\nA: {values[i]}" for i in range(count - 1)]
            question = "\n\n".join([*([header] if header else []), *shots, f"Q: {questions[-1]}\nA:"])
        else:
            chosen = rng.sample(range(count), rng.randint(1, count) if task == "doc_qa" else 1)
            question = questions[chosen[0]]
            if len(chosen) > 1:
                lines = [f"{n}. {questions[i]}" for n, i in enumerate(chosen, start=1)]
                question = "\n".join([rng.choice(_MULTI_HEADERS), *lines])
        meta["answers"] = [
            {"answer": values[i], "evidence": statements[i], "format": kinds[i].name, "depth": depths[i]}
            for i in chosen
        ]
        meta["planted"] = count
        if len(chosen) == 1:
            meta["evidence"] = statements[chosen[0]]
        return question, "; ".join(values[i] for i in chosen), segments


def _check_weights(weights: dict[str, float]) -> dict[str, float]:
    """``task_weights`` validated: tasks of :data:`TASKS`, weights ≥ 0, one of them positive."""
    unknown = sorted(set(weights) - set(TASKS))
    if unknown:
        raise ValueError(f"task_weights: unknown tasks {unknown}; choose from {list(TASKS)}")
    negative = sorted(t for t, w in weights.items() if not w >= 0)
    if negative or not any(w > 0 for w in weights.values()):
        raise ValueError(f"task_weights: expected weights ≥ 0, one of them positive, got {weights}")
    return {t: float(weights[t]) for t in TASKS if t in weights}


def _fresh_values(kinds: list[FactFormat], fixed: str, rng: random.Random) -> list[str]:
    """A value per fact, drawn by its kind, none inside ``fixed`` (the passage and the prompt's other text)
    nor inside another value or containing one, so each appears in the prompt only where it is planted."""
    values: list[str] = []
    for kind in kinds:
        for _attempt in range(1000):
            value = kind.value(rng)
            if value not in fixed and not any(value in v or v in value for v in values):
                break
        else:
            raise ValueError(
                f"fact format {kind.name}: no value in 1000 draws that the passage does not hold"
            )
        values.append(value)
    return values


def _plant(
    segments: list[list[str]], statements: list[str], rng: random.Random
) -> tuple[list[list[str]], list[float]]:
    """``segments`` with each statement inserted at a unit boundary drawn uniformly over all of them, and
    each statement's depth (share of the passage's units before it, in ``[0, 1]``)."""
    flat = [(segment, unit, -1) for segment, units in enumerate(segments) for unit in units]
    positions = [rng.randint(0, len(flat)) for _ in statements]
    # from the last position back, so earlier positions stay put; at one position the statements keep order
    for k in sorted(range(len(statements)), key=lambda k: (positions[k], k), reverse=True):
        at = positions[k]
        flat.insert(at, (flat[at - 1][0] if at else 0, statements[k], k))
    planted: list[list[str]] = [[] for _ in segments]
    depths = [0.0] * len(statements)
    for index, (segment, unit, k) in enumerate(flat):
        planted[segment].append(unit)
        if k >= 0:
            depths[k] = round(index / (len(flat) - 1), 4)
    return planted, depths


def _render(source: TextSource, segments: list[list[str]]) -> str:
    """The passage text: each document's units joined as its source joins them, a blank line between two."""
    return "\n\n".join(source.join(units).rstrip() for units in segments)
