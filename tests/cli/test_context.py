"""The model's context, checked before any prefill in every verb that takes prompts: a prompt that does not
fit with the tokens generated after it is refused with both lengths, or cut as ``--truncate`` asks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from lkv.cli import main as lkv_main
from lkv.core.context import fit_context
from lkv.eval.results import RESULTS_FILE, RUN_FILE, ResultsFile
from tests.cli.conftest import label_args, write_prompts
from tests.conftest import TINY_HELDOUT, build_tiny_model, tiny_needle_task

CONTEXT = 64


@pytest.fixture(scope="module")
def short_model(tmp_path_factory) -> Path:
    """The tiny Llama with a 64-token context, saved as a HF folder."""
    folder = tmp_path_factory.mktemp("short") / "model"
    model, tokenizer = build_tiny_model("llama", max_position_embeddings=CONTEXT)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_fit_context_keeps_refuses_or_cuts_exactly():
    ids = list(range(10))
    assert fit_context(ids, 2, 12, "error") == ids
    assert fit_context(ids, 2, None, "error") == ids
    assert fit_context(ids, 4, 10, "left") == [4, 5, 6, 7, 8, 9]
    assert fit_context(ids, 3, 10, "middle") == [0, 1, 2, 6, 7, 8, 9]
    with pytest.raises(
        ValueError,
        match=r"^the prompt is 10 tokens, with the 4 after it .* 14: over the model's context of 10 tokens; shorten it, or cut it with --truncate left\|middle$",
    ):
        fit_context(ids, 4, 10, "error")
    with pytest.raises(ValueError, match=r"over the model's context of 4 tokens; shorten it$"):
        fit_context(ids, 4, 4, "middle")


def failure(args: list[str], capsys) -> str:
    """The one error line of ``lkv ARGS``, which must fail without a traceback."""
    with pytest.raises(SystemExit) as exit_:
        lkv_main(args)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def generate(model: Path, *options: str) -> list[str]:
    return [
        "generate",
        "--model",
        str(model),
        "--prompt",
        "alpha beta " * 40,
        "--max_new_tokens",
        "4",
        *options,
    ]


def test_generate_refuses_a_prompt_over_the_context(short_model, capsys):
    line = failure(generate(short_model), capsys)
    assert re.fullmatch(
        r"lkv generate: error: the prompt is (\d+) tokens, with the 4 after it \(question, answer\) \d+: over "
        rf"the model's context of {CONTEXT} tokens; shorten it, or cut it with --truncate left\|middle",
        line,
    ), line


@pytest.mark.parametrize("truncate", ["left", "middle"])
def test_generate_cuts_a_prompt_to_the_context_when_asked(short_model, truncate, capsys):
    lkv_main(generate(short_model, "--truncate", truncate, "--budget", "40"))
    assert f"{CONTEXT - 4} prompt tokens]" in capsys.readouterr().err


def test_generate_question_agnostic_keeps_room_for_the_question(short_model, capsys):
    lkv_main(generate(short_model, "--truncate", "left", "--budget", "40", "--question", "which word?"))
    err = capsys.readouterr().err
    prompt_tokens = int(re.search(r"(\d+) prompt tokens\]", err).group(1))
    assert prompt_tokens == CONTEXT - 4  # the cut context and the whole question fill the room left


def test_label_refuses_limits_over_the_context(short_model, tmp_path, capsys):
    write_prompts(tmp_path / "prompts.jsonl", 2)
    args = label_args(tmp_path, tmp_path / "labels", tmp_path / "prompts.jsonl", model=short_model)
    line = failure(args, capsys)
    assert line == (
        f"lkv label: error: --max_prompt_tokens 256 + --response_tokens 5 is over the model's context of "
        f"{CONTEXT} tokens; give --max_prompt_tokens {CONTEXT - 5} or less (longer prompts follow --truncation)"
    )
    assert not (tmp_path / "labels").exists()


def test_eval_refuses_a_sample_over_the_context_before_its_prefill(
    short_model, tiny_corpus, tmp_path, capsys
):
    essays, _ = tiny_corpus
    task = {"lengths": [200], "depths": [0.5], "essays_dir": str(essays), "heldout_fraction": TINY_HELDOUT}
    config = tmp_path / "eval.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tasks": [{"class_path": "lkv.eval.tasks.NeedleTask", "init_args": task}],
                "methods": ["fullkv"],
                "budgets": [16],
                "model": str(short_model),
                "output": str(tmp_path / "eval"),
                "progress": False,
            }
        )
    )
    line = failure(["eval", "--config", str(config)], capsys)
    assert re.fullmatch(
        r"lkv eval: error: task niah, sample \S+: the prompt is \d+ tokens, with the \d+ after it \(question, "
        rf"answer\) \d+: over the model's context of {CONTEXT} tokens; shorten it",  # the answer alone is over
        line,
    ), line


def test_eval_cuts_samples_as_asked_and_records_it(tiny_corpus, tmp_path):
    import lkv.commands.eval

    model, tokenizer = build_tiny_model("llama", max_position_embeddings=256)  # room for the question
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    settings = dict(
        tasks=[tiny_needle_task(tiny_corpus, lengths=(60,), max_new_tokens=2)],
        methods=("fullkv",),
        budgets=(8,),
        settings=("aware",),
        output=str(tmp_path / "eval"),
        model=str(tmp_path / "model"),
        progress=False,
    )
    lkv.commands.eval.evaluate(**settings, truncate="left")
    (row,) = ResultsFile(tmp_path / "eval" / RESULTS_FILE).rows
    assert row["prompt_tokens"] == 256 - 2  # the context cut, the question and the 2 answer tokens fill it
    assert json.loads((tmp_path / "eval" / RUN_FILE).read_text())["truncate"] == "left"
    with pytest.raises(ValueError, match="differs in: truncate"):
        lkv.commands.eval.evaluate(**settings)
