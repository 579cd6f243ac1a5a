"""One registry names every method: the CLI's choices, `lkv eval`'s default list and the docs' table."""

import re
from pathlib import Path

import pytest

from lkv.eviction.decoding import DecodeTimePress
from lkv.eviction.presses import Press
from lkv.eviction.registry import DEFAULT_METHODS, METHODS, MethodName, make_method, method_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"


def test_the_docs_table_is_generated_from_the_registry():
    text = DOCS.read_text()
    found = re.search(r"<!-- methods:begin -->\n(.*?)\n<!-- methods:end -->", text, re.S)
    assert found is not None, f"{DOCS}: no methods table markers"
    assert found.group(1) == method_table(), "docs/evaluation.md's method table is stale: regenerate it"


def test_every_name_builds_its_method_and_the_cli_choices_are_the_names():
    assert set(MethodName.__args__) == set(METHODS)
    assert set(DEFAULT_METHODS) <= set(METHODS) and "fullkv" in DEFAULT_METHODS
    for name, method in METHODS.items():
        if method.needs and name not in ("oracle",):
            continue  # lookaheadkv needs an adapter, speckv a draft model
        built = make_method(name.upper())
        assert isinstance(built, Press) and built.name == name
        assert isinstance(built, DecodeTimePress) == (method.acts == "decode")


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown eviction method 'nope'; choose one of fullkv, oracle"):
        make_method("nope")
