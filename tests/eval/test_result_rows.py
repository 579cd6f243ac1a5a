"""Result rows are built through :class:`lkv.eval.results.ResultRow` and read back byte for byte as the rows
of committed result folders were written."""

import json
from pathlib import Path

import pytest

from lkv.eval.results import ResultRow, ResultsFile

ROOT = Path(__file__).resolve().parents[2]
# one committed folder per benchmark kind: end task, importance, needle tokens, multi-question
COMMITTED = [
    "experiments/full_evidence/results/results.jsonl",
    "experiments/compress_once/results/multi_question/results.jsonl",
    "experiments/length_mix/results/probe_1k/results.jsonl",
    "experiments/reach/tokens_far/results.jsonl",
]


@pytest.mark.parametrize("path", COMMITTED)
def test_committed_rows_are_written_again_byte_for_byte(path):
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    for line in lines:
        assert json.dumps(ResultRow(**json.loads(line)).as_json()) == line


def test_unset_optional_fields_are_left_out_and_required_ones_kept(tmp_path):
    row = ResultRow(
        task="importance",
        sample="s0",
        method="snapkv",
        budget="-",
        setting="aware",
        score=0.5,
        metrics={"recall@64": 0.5},
        prompt_tokens=10,
        prefill_s=0.1,
        score_s=0.2,
        meta={},
    )
    results = ResultsFile(tmp_path / "results.jsonl")
    results.add(row)
    assert list(json.loads((tmp_path / "results.jsonl").read_text())) == [
        "task",
        "sample",
        "method",
        "budget",
        "setting",
        "score",
        "metrics",
        "prompt_tokens",
        "prefill_s",
        "score_s",
        "meta",
    ]
    assert results.done[("importance", "s0", "snapkv", "-", "aware")] == row.as_json()
    with pytest.raises(TypeError, match="prompt_tokens"):
        ResultRow(**{k: v for k, v in row.as_json().items() if k != "prompt_tokens"})
