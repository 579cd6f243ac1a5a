"""More instruction families for the built-in training prompts, beyond the original five.

Each family turns a passage (sentences of an essay, or lines of code) into one instruction. Several of them
make the answer depend on a *specific* part of the passage that the instruction names (``quote``,
``locate``, ``keywords`` of one paragraph), which is what a lookahead module must learn to anticipate; the
others (``title``, ``continue``) spread the response's attention the way open-ended requests do.

:class:`~lkv.labels.builtin_prompts.BuiltinPrompts` draws them through its ``family_weights``. None of these wordings
is used by an evaluation task.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

_DEFINITION = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", re.MULTILINE)
_TERM = re.compile(r"\b[A-Za-z][a-z]{6,}\b")

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
