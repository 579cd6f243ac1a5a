"""`lkv eval --only_solved FOLDER`: exactly the (sample, setting) pairs an earlier run's FullKV solved, with the
answers an unscreened run gives them."""

import json

import pytest

import lkv.commands.eval
from lkv.eval.results import RESULTS_FILE, ResultsFile, row_key
from lkv.eval.screen import SolvedScreen
from tests.conftest import build_tiny_model, tiny_needle_task


@pytest.fixture
def model_folder(tmp_path):
    model, tokenizer = build_tiny_model("llama", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def run(tiny_corpus, model_folder, output, **options) -> list[dict]:
    lkv.commands.eval.evaluate(
        tasks=[tiny_needle_task(tiny_corpus, depths=(0.2, 0.4, 0.6, 0.8, 1.0))],
        methods=("fullkv", "streamingllm"),
        press_args={"streamingllm": {"sink": 2}},
        budgets=(8,),
        settings=("aware", "agnostic"),
        output=str(output),
        model=str(model_folder),
        progress=False,
        **options,
    )
    return ResultsFile(output / RESULTS_FILE).rows


def test_only_the_pairs_fullkv_solved_run_with_the_unscreened_answers(tiny_corpus, model_folder, tmp_path):
    whole = run(tiny_corpus, model_folder, tmp_path / "whole")
    samples = sorted({r["sample"] for r in whole})
    solved = {
        (samples[0], "aware"),
        (samples[2], "aware"),
        (samples[2], "agnostic"),
        (samples[3], "agnostic"),
    }
    # an earlier folder in which FullKV solved exactly those pairs (the tiny model solves none of its own)
    (tmp_path / "screen").mkdir()
    screen_rows = [
        {**r, "score": float((r["sample"], r["setting"]) in solved)} for r in whole if r["method"] == "fullkv"
    ]
    (tmp_path / "screen" / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in screen_rows))

    rows = run(
        tiny_corpus, model_folder, tmp_path / "screened", only_solved=str(tmp_path / "screen"), shard="1/1"
    )
    assert {(r["sample"], r["setting"]) for r in rows} == solved
    assert {(r["sample"], r["setting"]) for r in rows if r["method"] == "streamingllm"} == solved
    unscreened = {row_key(r): r["answer_ids"] for r in whole}
    assert all(unscreened[row_key(r)] == r["answer_ids"] for r in rows)


def test_a_screen_without_the_runs_fullkv_rows_is_refused(tiny_corpus, model_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="--only_solved: no results.jsonl at"):
        SolvedScreen.load(tmp_path / "nowhere", ["needle"], ["aware"])
    whole = run(tiny_corpus, model_folder, tmp_path / "whole")
    task = whole[0]["task"]
    with pytest.raises(
        ValueError, match=rf"no FullKV row of task 'other' \(aware\), 'other' \(mid\), '{task}' \(mid\) to"
    ):
        SolvedScreen.load(tmp_path / "whole", ["other", task], ["aware", "mid"])
    assert SolvedScreen.load(tmp_path / "whole" / RESULTS_FILE, [task], ["aware"]).folder.name == RESULTS_FILE


def test_a_screen_scored_on_other_prompts_under_the_same_ids_is_refused(tiny_corpus, model_folder, tmp_path):
    whole = run(tiny_corpus, model_folder, tmp_path / "whole")
    fullkv = [r for r in whole if r["method"] == "fullkv"]
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / RESULTS_FILE).write_text(
        "".join(json.dumps({**r, "score": 1.0}) + "\n" for r in fullkv)
    )
    assert run(tiny_corpus, model_folder, tmp_path / "kept", only_solved=str(tmp_path / "same"))
    # the screen scored sample 0 on a prompt with its needle elsewhere: its outcome says nothing of this one
    moved = fullkv[0]["sample"]
    assert "depth" in fullkv[0]["meta"]
    other = [{**r, "meta": {**r["meta"], "depth": -1.0}} if r["sample"] == moved else r for r in fullkv]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / RESULTS_FILE).write_text(
        "".join(json.dumps({**r, "score": 1.0}) + "\n" for r in other)
    )
    where = tmp_path / "other" / RESULTS_FILE
    with pytest.raises(
        ValueError, match=rf"--only_solved {where}: 1 sample\(s\) of .*{moved} \(meta differs in: depth"
    ):
        run(tiny_corpus, model_folder, tmp_path / "refused", only_solved=str(tmp_path / "other"))
    assert not ResultsFile(tmp_path / "refused" / RESULTS_FILE).rows  # refused before any row
