"""Training prompts over many text sources: a fact planted in a passage of a source's ``train`` documents.

:class:`SourcePrompts` is the prompt source a training mix uses to reach beyond the essays and the standard
library: each prompt is a passage of whole units (sentences or lines) of one ``train`` document of one
in-group source of :mod:`lkv.labels.sources`, a ``train`` fact of :mod:`lkv.labels.facts` planted at a random
unit boundary, and the fact's question after it. It refuses the held-out sources
(:func:`lkv.labels.sources.training_source`) and any fact format that is not on the ``train`` side, so the
generalisation task's ``out-of-source`` rows and held-out kinds stay unseen by whatever it trains.
"""

from __future__ import annotations

import random
from itertools import accumulate

from lkv.labels.facts import TRAIN_KEYS
from lkv.labels.passage_prompts import PassagePrompts
from lkv.labels.prompts import Prompt, prompt_id
from lkv.labels.sources import IN_SOURCES, TextSource, draw_document

#: The fact formats a ``find_value`` passage plants by default.
DEFAULT_FACT_FORMATS = ("magic_number", "serial_code", "iso_date")


class SourcePrompts(PassagePrompts):
    """``find_value`` prompts over the ``train`` documents of in-group text sources.

    Prompt ``i`` depends only on ``seed``, ``i`` and the settings (a longer run extends a shorter one): a
    source drawn uniformly, a document of its ``train`` split, a window of ``[min_words, max_words]`` words
    from a random unit (the document's end cuts it short), a fact with a training key at a random boundary.
    ``meta`` holds the question (the text after the passage), the evidence sentence and the fact's depth.
    The settings are :class:`~lkv.labels.passage_prompts.PassagePrompts`' (each documented there).
    """

    stream = "lkv-sources"
    described = ("sources", "num_prompts", "words", "fact_formats", "seed")
    #: passages of at least ``min_words`` words: shorter documents are drawn again, and a window starts where
    #: the rest of its document holds its drawn length (off: any document, any start; the end cuts it short)
    whole_passages = False

    def __init__(
        self,
        sources: tuple[str, ...] = IN_SOURCES,
        num_prompts: int = 64,
        min_words: int = 200,
        max_words: int = 800,
        fact_formats: tuple[str, ...] = DEFAULT_FACT_FORMATS,
        seed: int = 0,
        roots: dict[str, str] | None = None,
    ) -> None:
        super().__init__(sources, num_prompts, min_words, max_words, fact_formats, seed, roots)

    def _passage(
        self, rng: random.Random, doc_ids: dict[str, list[str]]
    ) -> tuple[TextSource, str, list[str], int]:
        """``(source, doc_id, units, words)``: a source drawn uniformly, one of its :attr:`split` documents and a
        window of whole units from a random one until ``[min_words, max_words]`` words (or the document's end;
        see :attr:`whole_passages`)."""
        source = rng.choice(self._sources)
        doc_id, units = draw_document(
            source, doc_ids[source.name], rng, self.min_words if self.whole_passages else 1
        )
        target = rng.randint(self.min_words, self.max_words)
        if self.whole_passages:
            rest = list(accumulate(len(u.split()) for u in reversed(units)))[::-1]  # words from each unit on
            start = rng.choice([i for i, words in enumerate(rest) if words >= target] or [0])
        else:
            start = rng.randrange(len(units))
        window: list[str] = []
        words = 0
        for unit in units[start:]:
            if words >= target:
                break
            window.append(unit)
            words += len(unit.split())
        return source, doc_id, window, words

    def _prompt(self, index: int, rng: random.Random, doc_ids: dict[str, list[str]]) -> Prompt:
        source, doc_id, window, words = self._passage(rng, doc_ids)
        fact = rng.choice(self._facts)
        key = rng.choice(TRAIN_KEYS)
        value = fact.value(rng)
        evidence = fact.statement.format(key=key, value=value)
        depth = rng.randint(0, len(window))
        window.insert(depth, source.as_unit(evidence))
        question = rng.choice(fact.questions).format(key=key)
        messages = [{"role": "user", "content": f"{source.join(window).rstrip()}\n\n{question}"}]
        return Prompt(
            id=prompt_id(f"sources-s{self.seed}", index, messages),
            messages=messages,
            source=source.name,
            doc_id=doc_id,
            kind="find_value",
            answer=value,
            meta={
                "question": question,
                "evidence": evidence,
                "format": fact.name,
                "depth": round(depth / len(window), 4),
                "words": words,
            },
        )
