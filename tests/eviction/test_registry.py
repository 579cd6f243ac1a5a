"""One registry names every method: the CLI's choices, `lkv eval`'s default list and the docs' table."""

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from lkv.eviction import names
from lkv.eviction.decoding import DecodeTimePress
from lkv.eviction.names import MethodName
from lkv.eviction.presses import Press
from lkv.eviction.registry import DEFAULT_METHODS, METHODS, make_method, method_table
from lkv.eviction.roles import ADAPTER_METHOD, PROBE_METHOD, REFERENCE, ROLES, UPPER_BOUND, Roles, roles_of

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evaluation.md"


def test_the_docs_table_is_generated_from_the_registry():
    text = DOCS.read_text()
    found = re.search(r"<!-- methods:begin -->\n(.*?)\n<!-- methods:end -->", text, re.S)
    assert found is not None, f"{DOCS}: no methods table markers"
    assert found.group(1) == method_table(), "docs/evaluation.md's method table is stale: regenerate it"


def test_every_name_builds_its_method_and_the_cli_choices_are_the_names():
    assert get_args(MethodName) == tuple(METHODS)  # the light names list the registry, in its order
    assert set(DEFAULT_METHODS) <= set(METHODS) and "fullkv" in DEFAULT_METHODS
    assert (
        names.DEFAULT_METHODS == DEFAULT_METHODS
    )  # the light default (`lkv eval --methods`) is the registry's
    for name, method in METHODS.items():
        if method.needs and name not in ("oracle",):
            continue  # lookaheadkv needs an adapter, speckv a draft model
        built = make_method(name.upper())
        assert isinstance(built, Press) and built.name == name
        assert isinstance(built, DecodeTimePress) == (method.acts == "decode")


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown eviction method 'nope'; choose one of fullkv, oracle"):
        make_method("nope")


def test_method_roles_are_plain_data_beside_the_registry():
    assert set(ROLES) <= set(METHODS)
    assert all(METHODS[name].roles == roles for name, roles in ROLES.items())
    # reading and pairing result rows loads no model code (torch, transformers)
    check = "import sys, lkv.eval.paired; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout

    assert (REFERENCE, UPPER_BOUND, ADAPTER_METHOD, PROBE_METHOD) == (
        "fullkv",
        "oracle",
        "lookaheadkv",
        "probe",
    )
    assert roles_of("fullkv") == Roles("reference", evicts=False, unranked="keeps everything")
    assert roles_of("oracle").role == "upper bound" and roles_of("oracle").unranked
    # a named lookahead module of `lkv eval --adapters` is the same method on another module
    assert roles_of("lookaheadkv:s1") == roles_of("lookaheadkv") == Roles(requires="adapter")
    assert roles_of("quest").evicts is False and roles_of("pyramidkv").unranked
    assert roles_of("snapkv") == Roles() == roles_of("snapkv-window8")  # a press under a name of its own
    decode_time = {name for name, m in METHODS.items() if m.acts == "decode"}
    assert decode_time == {"h2o-decode", "scissorhands", "quest"}
