"""`lkv generate`'s options are checked as one GenerateSettings, named as the user writes them."""

import dataclasses
import inspect

import pytest

from lkv.commands.generate import generate
from lkv.commands.generate_settings import GenerateSettings
from lkv.core.budget import Budget


def defaults(**changes) -> dict:
    """generate's defaults with a prompt and ``changes``."""
    given = {k: p.default for k, p in inspect.signature(generate).parameters.items()}
    return {**given, "prompt": "Hello", **changes}


def test_the_fields_are_the_options_of_generate():
    options = [f.name for f in dataclasses.fields(GenerateSettings) if f.init]
    assert options == list(inspect.signature(generate).parameters)


def test_derived_fields_follow_from_the_options(tmp_path):
    (tmp_path / "p.txt").write_text("from a file")
    run = GenerateSettings(**defaults(prompt=None, prompt_file=str(tmp_path / "p.txt"), budget=0.5, sink=4))
    assert run.text == "from a file" and run.checked_budget == Budget(0.5)
    assert run.selection.sink == 4 and run.lookahead is None and run.fused_probe is None


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"prompt": None}, ValueError, "give exactly one of --prompt and --prompt_file"),
        (
            {"prompt": None, "prompt_file": "/no/such"},
            FileNotFoundError,
            "--prompt_file /no/such: no such file",
        ),
        ({"prompt": "  "}, ValueError, "the prompt is empty"),
        ({"budget": -1}, ValueError, "--budget: "),
        ({"method": "lookaheadkv"}, ValueError, "--adapter is required by --method lookaheadkv"),
        (
            {"kernel": 3, "pooling": "max"},
            ValueError,
            "--kernel, --pooling: settings of --method lookaheadkv",
        ),
        ({"method": "probe"}, ValueError, "--probe is required by --method probe"),
        ({"method": "restorekv"}, ValueError, "press_args for restorekv: give the trained restore folder"),
        (
            {"method": "restorekv", "press_args": {"folder": "/nowhere"}},
            ValueError,
            "press_args for restorekv: folder: /nowhere/restorekv.json: not found",
        ),
    ],
)
def test_a_bad_option_is_refused_naming_its_flag(changes, error, message):
    with pytest.raises(error, match=message):
        GenerateSettings(**defaults(**changes))
