"""Instruction families of the training prompts: each turns a passage (prose or code) into one instruction.

The original families (:data:`PROSE_FAMILIES`, :data:`CODE_FAMILIES`: ``summarize``, ``question``,
``extract``, ``code``) ask about the passage as a whole or about a frequent term or a defined name in it. The
extra ones (:data:`EXTRA_FAMILIES`) make the answer depend on a *specific* part of the passage that the
instruction names (``quote``, ``locate``, ``keywords`` of one paragraph), which is what a lookahead module
must learn to anticipate; the others (``title``, ``continue``) spread the response's attention the way
open-ended requests do.

:class:`~lkv.labels.builtin_prompts.BuiltinPrompts` draws them (the extra ones through its ``family_weights``),
and :class:`~lkv.labels.task_mix.TaskMixPrompts` for its instruction and code tasks. None of these wordings is
used by an evaluation task.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

_DEFINITION = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.MULTILINE)
_TERM = re.compile(r"\b[A-Za-z][a-z]{6,}\b")
# ``question``'s terms: long words, counted inside longer ones too (as the original prompts were drawn)
_FREQUENT_TERM = re.compile(r"[A-Za-z][a-z]{6,}")
_STOPWORDS = {"because", "through", "without", "something", "another", "anything", "between", "already"}

#: The original families that apply to prose passages and to code passages.
PROSE_FAMILIES = ("summarize", "question", "extract")
CODE_FAMILIES = ("code", "extract")

_SUMMARIZE = (
    "Summarize the passage in three or four sentences.",
    "Write a short summary of this text for someone who has not read it.",
    "What are the main points of the passage? Answer with a short bulleted list.",
    "In one paragraph, explain what the author is arguing here.",
    "Give a one-sentence summary of the text, then list its key supporting points.",
)
_QUESTION_ABOUT = (
    'What does the passage say about "{term}"?',
    'According to the text, why does "{term}" matter? Quote the sentence that supports your answer.',
    'Explain how the author uses the idea of "{term}" in this passage.',
    'Find the part of the text that discusses "{term}" and restate it in your own words.',
)
_QUESTION_GENERAL = (
    "What is the author's main claim in this passage, and what evidence is given for it?",
    "Which example in the text best supports the author's argument? Explain why.",
    "What question is the passage trying to answer, and what answer does it give?",
)
_EXTRACT_PROSE = (
    "List every person, company and place named in the text.",
    "Extract all numbers, dates and quantities in the passage, each with what it refers to.",
    "List the distinct claims the author makes, one per line.",
    "Make a bulleted list of the examples the author uses.",
)
_EXTRACT_CODE = (
    "List every function and class defined in this code, with a one-line description of each.",
    "List the modules and names this code imports or relies on.",
    "Extract all string literals and constants in the code, with where each is used.",
    "List the exceptions this code can raise and when.",
)
_CODE_ABOUT = (
    "Explain what `{name}` does, step by step.",
    "Write a docstring for `{name}` describing its arguments and return value.",
    "How could `{name}` fail? Describe the edge cases a test should cover.",
    "Write a short usage example that calls `{name}`.",
)
_CODE_GENERAL = (
    "Explain what this code does.",
    "Continue this code: write the next function it would plausibly contain.",
    "Describe the purpose of this code and how its parts fit together.",
    "Suggest changes that would make this code easier to read.",
)

_TITLE = (
    "Suggest a short, fitting title for this passage.",
    "Give this text a headline of at most eight words.",
)
_KEYWORDS = (
    "List five keywords that capture what this passage is about.",
    "Which terms would you index this text under? Give up to six.",
)
_QUOTE = (
    'Quote, word for word, the sentence in which the word "{term}" first appears.',
    'Copy the sentence that contains "{term}" and explain it in one line.',
)
_CONTINUE = (
    "Continue the text with one more paragraph in the same style.",
    "What would the author most likely say next? Write two sentences.",
)
_LOCATE = (
    "Quote the line that defines `{name}` and the line that follows it.",
    "Where is `{name}` defined? Copy its signature exactly.",
)
_REVIEW = (
    "Point out one line of this code that could hide a bug, and say why.",
    "Which part of this code would you test first, and with what input?",
)


@dataclass(frozen=True)
class InstructionFamily:
    """An instruction family: which passages it applies to and how it writes the instruction.

    Attributes:
        name: the prompt's ``kind``.
        prose: applies to essay passages.
        code: applies to code passages.
        build: ``(passage text, rng) → instruction``.
    """

    name: str
    prose: bool
    code: bool
    build: Callable[[str, random.Random], str]


def _quote(text: str, rng: random.Random) -> str:
    terms = sorted({w.lower() for w in _TERM.findall(text)})
    return rng.choice(_QUOTE).format(term=rng.choice(terms)) if terms else rng.choice(_KEYWORDS)


def _locate(text: str, rng: random.Random) -> str:
    names = sorted(set(_DEFINITION.findall(text)))
    return rng.choice(_LOCATE).format(name=rng.choice(names)) if names else rng.choice(_REVIEW)


EXTRA_FAMILIES: dict[str, InstructionFamily] = {
    f.name: f
    for f in (
        InstructionFamily("title", True, True, lambda _text, rng: rng.choice(_TITLE)),
        InstructionFamily("keywords", True, True, lambda _text, rng: rng.choice(_KEYWORDS)),
        InstructionFamily("quote", True, False, _quote),
        InstructionFamily("continue", True, False, lambda _text, rng: rng.choice(_CONTINUE)),
        InstructionFamily("locate", False, True, _locate),
        InstructionFamily("review", False, True, lambda _text, rng: rng.choice(_REVIEW)),
    )
}

#: Every family name: the original ones, then the extra ones.
FAMILIES = (*PROSE_FAMILIES, "code", *EXTRA_FAMILIES)


def applies(family: str, code: bool) -> bool:
    """Whether ``family`` writes instructions for a code passage (``code``) or a prose one."""
    if family in EXTRA_FAMILIES:
        return EXTRA_FAMILIES[family].code if code else EXTRA_FAMILIES[family].prose
    return family in (CODE_FAMILIES if code else PROSE_FAMILIES)


def write_instruction(family: str, text: str, code: bool, rng: random.Random) -> str:
    """An instruction of ``family`` (one of :data:`FAMILIES`) about the passage ``text``.

    ``question`` asks about one of the passage's five most frequent long words (or in general), ``code``
    about a function or class the code defines (or in general), ``extract`` in wordings for code or prose.

    Raises:
        ValueError: ``family`` is not one of :data:`FAMILIES`.
    """
    if family in EXTRA_FAMILIES:
        return EXTRA_FAMILIES[family].build(text, rng)
    if family == "summarize":
        return rng.choice(_SUMMARIZE)
    if family == "extract":
        return rng.choice(_EXTRACT_CODE if code else _EXTRACT_PROSE)
    if family == "code":
        names = sorted(set(_DEFINITION.findall(text)))
        if names and rng.random() < 0.5:
            return rng.choice(_CODE_ABOUT).format(name=rng.choice(names))
        return rng.choice(_CODE_GENERAL)
    if family != "question":
        raise ValueError(f"unknown instruction family {family!r}; choose one of {', '.join(FAMILIES)}")
    counts = Counter(w.lower() for w in _FREQUENT_TERM.findall(text) if w.lower() not in _STOPWORDS)
    terms = [word for word, _ in counts.most_common(5)]
    if terms and rng.random() < 0.7:
        return rng.choice(_QUESTION_ABOUT).format(term=rng.choice(terms))
    return rng.choice(_QUESTION_GENERAL)
