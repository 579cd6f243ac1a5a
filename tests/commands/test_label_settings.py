"""`lkv label`'s options are checked as one LabelSettings, named as the user writes them."""

import dataclasses
import inspect
import json

import pytest

from lkv.commands.label import label
from lkv.commands.label_settings import LabelSettings
from lkv.labels.dataset_prompts import JsonlPrompts


def options(tmp_path, lines=("a", "b"), **changes) -> dict:
    """label's defaults for a JSONL source of ``lines`` (one prompt each, id = its text), with ``changes``."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {t}", "id": t}) + "\n" for t in lines))
    given = {k: p.default for k, p in inspect.signature(label).parameters.items()}
    return {
        **given,
        "output": str(tmp_path / "labels"),
        "prompts": JsonlPrompts(str(path), id_field="id"),
        **changes,
    }


def test_the_fields_are_the_options_of_label():
    fields = [f.name for f in dataclasses.fields(LabelSettings) if f.init]
    assert fields == list(inspect.signature(label).parameters)


def test_the_prompts_are_listed_once(tmp_path):
    assert [p.id for p in LabelSettings(**options(tmp_path)).all_prompts] == ["a", "b"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"label_mode": "both"}, "--label_mode: expected one of"),
        (
            {"label_mode": "agnostic", "store_scores": False},
            "--label_mode agnostic needs --store_scores true",
        ),
        ({"label_mode": "agnostic", "responses": "r.jsonl"}, "--label_mode agnostic generates its responses"),
        ({"gold_answers": True, "responses": "r.jsonl"}, "--gold_answers replaces wrong answers"),
        ({"shard_size": 0}, "--shard_size: expected a positive number, found 0"),
        ({"label_mode": "agnostic", "question_reduction": "min"}, "--question_reduction: expected one of"),
        ({"question_reduction": "mean"}, "--question_reduction reduces the questions of agnostic labels"),
        ({"lines": ()}, "prompts: expected at least one prompt"),
        ({"batch_size": -2}, "--batch_size: expected a positive number, found -2"),
    ],
)
def test_a_bad_option_is_refused_naming_its_flag(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        LabelSettings(**options(tmp_path, **changes))
