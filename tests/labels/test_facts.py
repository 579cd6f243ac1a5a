"""The training fact formats' values stay apart from the evaluation-only kinds they are meant to generalise to."""

import random
import re

import pytest

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


NEW_KINDS = ("serial_code", "iso_date", "measurement", "contact_name", "badge_code")


def test_the_generalisation_kinds_span_every_side_and_heldout_ones_share_no_word_with_training():
    sides = {name: facts.fact_format(name).side for name in NEW_KINDS}
    assert sides == {
        "serial_code": "train",
        "iso_date": "train",
        "measurement": "eval",
        "contact_name": "heldout",
        "badge_code": "heldout",
    }
    assert {f.name for f in formats("heldout")} == {"contact_name", "badge_code"}
    rng = random.Random(2)
    train_words = _words([f.value(rng) for f in formats("train") for _ in range(300)])
    heldout_values = [f.value(rng) for f in formats("heldout") for _ in range(300)]
    assert not train_words & _words(heldout_values)
    assert all(len(facts.fact_format(name).questions) >= 3 for name in NEW_KINDS)
    assert len(facts.contact_name_value(rng).split()) == 3  # a multi-token personal name
    assert re.fullmatch(
        r"\d+\.\d (kilograms|litres|millimetres|kilowatts|volts|hectares|newtons|kilopascals)",
        facts.measurement_value(rng),
    )
    assert re.fullmatch(
        r"(\d[A-Z]\d[A-Z]|[A-Z]\d[A-Z]\d)-(\d[A-Z]\d[A-Z]|[A-Z]\d[A-Z]\d)", facts.serial_code_value(rng)
    )


def test_training_prompts_refuse_heldout_kinds():
    from lkv.labels.builtin_prompts import BuiltinPrompts

    with pytest.raises(ValueError, match=r"\['contact_name'\] are evaluation-only"):
        BuiltinPrompts(fact_formats=("serial_code", "contact_name"))
    with pytest.raises(ValueError, match=r"side must be one of \('train', 'eval', 'heldout'\), got 'test'"):
        formats("test")
