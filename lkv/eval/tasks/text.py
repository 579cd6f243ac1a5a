"""Held-out text for the generated tasks: essays cut into sentences, a word list, standard-library code,
an evaluation-only prose corpus (the language reference of ``pydoc_data``,
:func:`lkv.labels.sources.pydoc_prose`) and haystacks of any text source's non-training split.

Only documents on the held-out side of :func:`lkv.labels.prompts.split_by_document` (the split the training
prompts use) or corpora no training prompt reads are used here, so no evaluation text was seen while
training a lookahead module.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION, essay_documents, split_by_document, stdlib_documents
from lkv.labels.sources import Split, TextSource, pydoc_prose, split_sentences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_WORD = re.compile(r"\b[a-z]{6,12}\b")  # long enough to skip most function words
T = TypeVar("T")
_BATCH = 64  # units tokenised at a time while a source's haystack grows
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def heldout_ids(doc_ids: list[str], heldout_fraction: float) -> list[str]:
    """The held-out documents among ``doc_ids``, sorted (the same split as the training prompts)."""
    _, heldout = split_by_document(doc_ids, heldout_fraction)
    return sorted(heldout)


@dataclass
class Sentence:
    text: str
    doc_id: str
    tokens: int


class SentenceCorpus:
    """Documents as one cyclic stream of sentences with token counts: the haystack of the generated tasks.

    Args:
        tokenizer: measures sentence lengths in tokens.
        texts: doc id → prose text, in the order the stream visits them.
        name: the corpus, for error messages.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, texts: dict[str, str], name: str) -> None:
        if not texts:
            raise ValueError(f"{name}: no document to build a haystack from")
        self.name = name
        self.doc_ids = list(texts)
        pieces = [(doc, sentence) for doc in self.doc_ids for sentence in split_sentences(texts[doc])]
        # " " + sentence: the token count of a sentence as it appears inside running text.
        counts = tokenizer([" " + s for _, s in pieces], add_special_tokens=False)["input_ids"]
        self.sentences = [Sentence(s, doc, len(ids)) for (doc, s), ids in zip(pieces, counts, strict=True)]
        self.total_tokens = sum(s.tokens for s in self.sentences)

    def take(self, tokens: int, start: int) -> list[Sentence]:
        """Consecutive sentences from index ``start`` (wrapping around) totalling ``tokens`` to within half a
        sentence."""
        if tokens > self.total_tokens:
            raise ValueError(
                f"asked for a {tokens}-token haystack, {self.name} holds {self.total_tokens} tokens"
            )
        out: list[Sentence] = []
        total = 0
        index = start % len(self.sentences)
        while total < tokens:
            out.append(self.sentences[index])
            total += self.sentences[index].tokens
            index = (index + 1) % len(self.sentences)
        if len(out) > 1 and total - tokens > tokens - (total - out[-1].tokens):
            out.pop()  # closer without the last sentence
        return out

    @cached_property
    def words(self) -> list[str]:
        """Distinct lower-case words (6–12 letters) of the corpus, sorted: keys and word lists."""
        return corpus_words(s.text for s in self.sentences)


def corpus_words(texts: Iterable[str]) -> list[str]:
    """Distinct lower-case words of 6–12 letters in ``texts``, sorted."""
    return sorted({w for text in texts for w in _WORD.findall(text)})


class SplitUnits:
    """One split of a text source, each document read and cut into units (:meth:`TextSource.units`) once, on
    its first draw: a task draws many haystacks from the same few documents.

    Raises:
        ValueError: the split holds no document.
    """

    def __init__(self, source: TextSource, split: Split) -> None:
        self.source = source
        self.doc_ids = source.doc_ids(split)
        if not self.doc_ids:
            raise ValueError(f"text source {source.name}: no document on its {split!r} split")
        self._units: dict[str, list[str]] = {}

    def units(self, doc_id: str) -> list[str]:
        """The units of document ``doc_id``, in order."""
        if doc_id not in self._units:
            self._units[doc_id] = self.source.units(self.source.document(doc_id).text)
        return self._units[doc_id]


def source_haystack(
    documents: SplitUnits,
    tokenizer: PreTrainedTokenizerBase,
    tokens: int,
    rng: random.Random,
) -> list[Sentence]:
    """Consecutive units of a source's split's documents drawn in a random order, the first from a random
    unit, until ``tokens`` tokens (each unit counted as it appears in running text); every document at most
    once, so a split holding fewer tokens (chatterbot-dialogue's ``dev`` holds ~5.5K) gives all of it."""
    out: list[Sentence] = []
    total = 0
    source = documents.source
    for doc_id in rng.sample(documents.doc_ids, len(documents.doc_ids)):
        units = documents.units(doc_id)
        start = rng.randrange(len(units)) if not out and units else 0
        for at in range(start, len(units), _BATCH):
            batch = units[at : at + _BATCH]
            shown = [" " + u for u in batch] if source.unit == "sentence" else batch
            counts = tokenizer(shown, add_special_tokens=False)["input_ids"]
            for unit, ids in zip(batch, counts, strict=True):
                out.append(Sentence(unit, doc_id, len(ids)))
                total += len(ids)
                if total >= tokens:
                    return out
    return out


class HeldoutEssays(SentenceCorpus):
    """The held-out Paul Graham essays (the training prompts' split) as a :class:`SentenceCorpus`.

    Args:
        tokenizer: measures sentence lengths in tokens.
        essays_dir: essay folder; default: the cached embedded essays.
        heldout_fraction: must match the training prompts' split (default: the library default).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        files = essay_documents(essays_dir)
        doc_ids = heldout_ids(list(files), heldout_fraction)
        if not doc_ids:
            raise ValueError(
                f"no held-out essay among the {len(files)} in {essays_dir or 'the asset cache'} "
                f"(heldout_fraction={heldout_fraction})"
            )
        texts = {doc: files[doc].read_text(encoding="utf-8") for doc in doc_ids}
        super().__init__(tokenizer, texts, "the held-out essays")


class PydocProse(SentenceCorpus):
    """:func:`pydoc_prose` as a :class:`SentenceCorpus`: an evaluation-only haystack of technical prose."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(tokenizer, pydoc_prose(), "the pydoc prose")


def insert_at_depths(pieces: list[Sentence], needles: list[str], depths: list[float]) -> list[str]:
    """Sentence texts with each needle inserted at the sentence boundary nearest its token depth.

    Args:
        pieces: the haystack sentences.
        needles: sentences to insert.
        depths: per needle, the share of the haystack's tokens that precede it, in ``[0, 1]``.
    """
    if len(needles) != len(depths):
        raise ValueError(f"{len(needles)} needles but {len(depths)} depths")
    total = sum(p.tokens for p in pieces)
    before = [0]
    for piece in pieces:
        before.append(before[-1] + piece.tokens)
    slots: dict[int, list[str]] = {}
    for needle, depth in zip(needles, depths, strict=True):
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"needle depth must be in [0, 1], got {depth}")
        boundary = min(range(len(before)), key=lambda i: abs(before[i] - depth * total))
        slots.setdefault(boundary, []).append(needle)
    out: list[str] = []
    for index in range(len(pieces) + 1):
        out.extend(slots.get(index, []))
        if index < len(pieces):
            out.append(pieces[index].text)
    return out


def noise_haystack(tokenizer: PreTrainedTokenizerBase, tokens: int) -> list[Sentence]:
    """RULER's noise haystack: :data:`NOISE` repeated as sentences up to ``tokens`` tokens."""
    unit = split_sentences(NOISE)
    counts = [len(ids) for ids in tokenizer([" " + s for s in unit], add_special_tokens=False)["input_ids"]]
    out: list[Sentence] = []
    total = 0
    while total + counts[len(out) % len(unit)] <= tokens:
        index = len(out) % len(unit)
        out.append(Sentence(unit[index], "noise", counts[index]))
        total += counts[index]
    return out


def heldout_code(
    stdlib_dir: str | None = None, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
) -> dict[str, Path]:
    """Held-out Python standard-library modules: doc id → file (same split as the training prompts)."""
    files = stdlib_documents(stdlib_dir)
    held = {doc: files[doc] for doc in heldout_ids(list(files), heldout_fraction)}
    if not held:
        raise ValueError(f"no held-out module in {stdlib_dir or 'the standard library'}")
    return held


def draw_module(
    files: dict[str, Path], rng: random.Random, attempts: int, make: Callable[..., T | None], *args: Any
) -> T | None:
    """Draw held-out modules (``rng.choice`` over the sorted doc ids of :func:`heldout_code`'s ``files``) until
    ``make(doc_id, path, *args)`` gives a sample (None: this module has no fitting window); None after
    ``attempts`` draws."""
    doc_ids = sorted(files)
    for _attempt in range(attempts):
        doc_id = rng.choice(doc_ids)
        sample = make(doc_id, files[doc_id], *args)
        if sample is not None:
            return sample
    return None


def module_lines(
    tokenizer: PreTrainedTokenizerBase, path: Path, length: int
) -> tuple[str, list[str], list[int]] | None:
    """A module's source, its lines (ends kept) and each line's token count; None if it is not UTF-8 or is
    certainly shorter than ``length`` tokens (under ~2 characters per token)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) < 2 * length:
        return None
    lines = text.splitlines(keepends=True)
    counts = [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]]
    return text, lines, counts


def rng_for(*parts: object) -> random.Random:
    """A generator seeded from the given parts (a sample depends only on its own settings)."""
    return random.Random(":".join(str(p) for p in parts))
