"""The training fact formats' values stay apart from the evaluation-only kinds they are meant to generalise to."""

import random
import re

from lkv.labels import facts
from lkv.labels.facts import formats


def _words(values: list[str]) -> set[str]:
    """Words of three letters or more (letter codes' pairs such as ``PM`` are not words)."""
    return {w.lower() for v in values for w in re.findall(r"[A-Za-z]{3,}", v)}


def test_word_valued_training_facts_share_no_word_with_evaluation_only_values():
    rng = random.Random(0)
    train_words = _words([f.value(rng) for f in formats("train") for _ in range(200)])
    eval_words = _words([f.value(rng) for f in formats("eval") for _ in range(200)])
    assert {"port", "moresby", "pickled", "lemon"} <= train_words  # the new kinds are drawn
    assert not train_words & eval_words
    assert not train_words & {w.lower() for w in facts.TRAIN_KEYS}


def test_training_values_are_not_all_numbers():
    """The far-data recipe's facts were all 7-digit numbers; a module trained on them only kept digits."""
    rng = random.Random(1)
    kinds = {f.name: f.value(rng) for f in formats("train")}
    non_numeric = {name for name, value in kinds.items() if not value.isdigit()}
    assert {"colour", "venue", "ingredient", "departure"} <= non_numeric
    assert re.fullmatch(r"(1[0-2]|[1-9]):[0-5][05] (am|pm)", facts.clock_value(rng))
