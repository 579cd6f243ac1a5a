"""The settings shared by the prompt sources over the in-group text sources, taken, checked and resolved once.

:class:`~lkv.labels.source_prompts.SourcePrompts`, its subclass
:class:`~lkv.labels.multi_question_prompts.MultiQuestionPrompts` and :class:`~lkv.labels.task_mix.TaskMixPrompts`
each draw passages of in-group documents (:mod:`lkv.labels.sources`) and plant ``train`` facts
(:mod:`lkv.labels.facts`) in them. :class:`PassagePrompts` holds what they share: the sources (held-out ones
refused), the prompt count, the passage length range, the fact formats (held-out kinds refused), the seed and the
source folders; the per-prompt random stream, the iteration over it, and :meth:`~PassagePrompts.describe`.
A subclass declares these settings in its own ``__init__`` signature (the ``--prompts.init_args`` options and
their defaults are read from it), passes them on, and adds only its own.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Iterator
from typing import ClassVar

from lkv.labels.facts import FactFormat, training_formats
from lkv.labels.prompts import Prompt, PromptSource, check_passage_counts
from lkv.labels.sources import TextSource, source_roots, split_doc_ids, training_sources


class PassagePrompts(PromptSource):
    """Prompts over passages of in-group documents with ``train`` facts planted.

    Prompt ``i`` is :meth:`_prompt` of the random stream ``<stream>:<seed>:<i>`` alone, so a longer run extends a
    shorter one. Construction checks every shared setting and resolves :attr:`_sources` (the text sources) and
    :attr:`_facts` (the fact formats).

    Args:
        sources: in-group source names (:data:`lkv.labels.sources.IN_SOURCES`); a held-out one is refused.
        num_prompts: prompts per iteration.
        min_words: shortest passage in whitespace-separated words.
        max_words: longest passage.
        fact_formats: ``train`` fact formats to plant.
        seed: base seed.
        roots: source name → folder to read it from instead of its usual place.

    Raises:
        ValueError: ``num_prompts < 0``, not ``1 ≤ min_words ≤ max_words``, no source, an unknown or held-out
            source (or root), or a fact format off the ``train`` side.
    """

    count_setting = "num_prompts"
    #: names the random stream of each prompt (``<stream>:<seed>:<index>``), one per prompt source class
    stream: ClassVar[str]
    #: the settings :meth:`describe` shows, in order (``words``: ``min_words..max_words``)
    described: ClassVar[tuple[str, ...]]
    #: the side of :func:`lkv.labels.sources.document_split` whose documents the passages come from
    split: str = "train"

    def __init__(
        self,
        sources: tuple[str, ...],
        num_prompts: int,
        min_words: int,
        max_words: int,
        fact_formats: tuple[str, ...],
        seed: int,
        roots: dict[str, str] | None,
    ) -> None:
        check_passage_counts(num_prompts, min_words, max_words)
        self.roots = source_roots(roots)
        self._sources: list[TextSource] = training_sources(tuple(sources), self.roots)
        self._facts: list[FactFormat] = training_formats(fact_formats)
        self.sources = tuple(sources)
        self.num_prompts = num_prompts
        self.min_words = min_words
        self.max_words = max_words
        self.fact_formats = tuple(fact_formats)
        self.seed = seed

    def __len__(self) -> int:
        return self.num_prompts

    @property
    def words(self) -> str:
        """The passage length range as :meth:`describe` shows it: ``min_words..max_words``."""
        return f"{self.min_words}..{self.max_words}"

    def describe(self) -> str:
        """``<class>(name=value, ...)`` over :attr:`described`, tuples shown as lists (label folders record it:
        :meth:`~lkv.labels.prompts.PromptSource.extends` compares it)."""
        shown = [(name, getattr(self, name)) for name in self.described]
        settings = ", ".join(f"{name}={list(v) if isinstance(v, tuple) else v}" for name, v in shown)
        return f"{type(self).__name__}({settings})"

    def _drawn_sources(self) -> list[TextSource]:
        """Every text source a prompt may draw a document from (its :attr:`split` ids are listed once)."""
        return self._sources

    def __iter__(self) -> Iterator[Prompt]:
        doc_ids = split_doc_ids(self._drawn_sources(), self.split)
        for index in range(self.num_prompts):
            yield self._prompt(index, random.Random(f"{self.stream}:{self.seed}:{index}"), doc_ids)

    @abstractmethod
    def _prompt(self, index: int, rng: random.Random, doc_ids: dict[str, list[str]]) -> Prompt:
        """Prompt ``index``, drawn from ``rng`` alone over ``doc_ids`` (source name → its :attr:`split` ids)."""
