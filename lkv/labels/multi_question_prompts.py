"""Training contexts asked several questions: the prompts of question-agnostic, multi-question labels.

:class:`MultiQuestionPrompts` draws a passage as :class:`~lkv.labels.source_prompts.SourcePrompts` does (the
``train`` or ``dev`` documents of in-group sources only) and plants ``questions`` ``train`` facts in it, one per depth
stratum, each with its own training key. A prompt's ``meta["context"]`` is the passage ending in ``"\\n\\n"``
and ``meta["questions"]`` the facts' questions: the layout of the multi-question evaluation
(:mod:`lkv.eval.tasks.multi_question`: the context compressed once, each question appended alone), so
``lkv label --label_mode agnostic`` labels the context with the union of the questions' attention
(:func:`lkv.labels.labeller.label_questions`) over exactly the tokens that evaluation compresses.
"""

from __future__ import annotations

import random
from typing import Literal

from lkv.labels.facts import TRAIN_KEYS
from lkv.labels.prompts import Prompt, prompt_id
from lkv.labels.source_prompts import DEFAULT_FACT_FORMATS, SourcePrompts
from lkv.labels.sources import IN_SOURCES


class MultiQuestionPrompts(SourcePrompts):
    """Passages of in-group ``train`` (or ``dev``) documents with ``questions`` planted facts, asked one by one.

    Prompt ``i`` depends only on ``seed``, ``i`` and the settings (a longer run extends a shorter one). The
    passage holds at least ``min_words`` words (documents shorter than that are drawn again; the defaults make
    ~1.3-2.3K tokens of prose) and is cut into ``questions`` equal strata of units; fact ``j`` (a ``train``
    format drawn per fact, a key of its own) goes at a random unit boundary of a stratum of its own (strata
    shuffled), so the facts spread from the passage's start to its end. ``messages`` hold the context followed by the first question
    (an aware label asks that one); ``meta`` holds ``context``, ``questions``, ``answers``, ``evidence``,
    ``formats`` and ``depths`` (in question order) and ``words``.

    Args:
        questions: ``k``, the facts and questions per context: 1 to ``len(TRAIN_KEYS)``.
        split: ``train`` documents (training labels) or ``dev`` ones (validation labels); never ``heldout``
            (the final check's documents).
        others: as :class:`~lkv.labels.passage_prompts.PassagePrompts` (a held-out source is refused).
    """

    stream = "lkv-multi-question"
    described = ("sources", "questions", "split", "num_prompts", "words", "fact_formats", "seed")
    whole_passages = True  # k strata need a passage of its full length, not a document's last lines

    def __init__(
        self,
        sources: tuple[str, ...] = IN_SOURCES,
        questions: int = 4,
        split: Literal["train", "dev"] = "train",
        num_prompts: int = 64,
        min_words: int = 1000,
        max_words: int = 1300,
        fact_formats: tuple[str, ...] = DEFAULT_FACT_FORMATS,
        seed: int = 0,
        roots: dict[str, str] | None = None,
    ) -> None:
        if not 1 <= questions <= len(TRAIN_KEYS):
            raise ValueError(
                f"questions: expected 1 to {len(TRAIN_KEYS)} questions per context (k, one training key "
                f"each), found {questions}"
            )
        if split not in ("train", "dev"):
            raise ValueError(
                f"split: expected 'train' or 'dev' documents, found {split!r} (held-out documents never label)"
            )
        super().__init__(sources, num_prompts, min_words, max_words, fact_formats, seed, roots)
        self.questions = questions
        self.split = split

    def _prompt(self, index: int, rng: random.Random, doc_ids: dict[str, list[str]]) -> Prompt:
        source, doc_id, window, words = self._passage(rng, doc_ids)
        k = self.questions
        facts = [rng.choice(self._facts) for _ in range(k)]
        keys = rng.sample(TRAIN_KEYS, k)
        values = [fact.value(rng) for fact in facts]
        evidence = [
            f.statement.format(key=key, value=v) for f, key, v in zip(facts, keys, values, strict=True)
        ]
        questions = [rng.choice(f.questions).format(key=key) for f, key in zip(facts, keys, strict=True)]
        units = len(window)
        strata = rng.sample(range(k), k)
        at = [rng.randint(units * s // k, units * (s + 1) // k) for s in strata]
        # from the deepest boundary up, so each insertion leaves the boundaries above it where they were
        for j in sorted(range(k), key=lambda j: at[j], reverse=True):
            window.insert(at[j], source.as_unit(evidence[j]))
        context = f"{source.join(window).rstrip()}\n\n"
        messages = [{"role": "user", "content": context + questions[0]}]
        return Prompt(
            id=prompt_id(f"multiq-{self.split}-s{self.seed}-k{k}", index, [messages, questions]),
            messages=messages,
            source=source.name,
            doc_id=doc_id,
            kind="multi_question",
            meta={
                "context": context,
                "questions": questions,
                "answers": values,
                "evidence": evidence,
                "formats": [f.name for f in facts],
                "depths": [round(a / units, 4) for a in at],
                "words": words,
            },
        )
