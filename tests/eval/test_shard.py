"""`lkv eval --shard k/n`: disjoint shares of every task's samples that together make exactly the unsharded rows."""

import pytest

import lkv.commands.eval
from lkv.commands.eval_run import PARTIAL_MARK
from lkv.eval.report import REPORT_FILE
from lkv.eval.results import RESULTS_FILE, ResultsFile, row_key
from lkv.eval.shard import Shard
from tests.conftest import build_tiny_model, tiny_needle_task


def test_a_shard_is_every_nth_item_from_its_own():
    items = list(range(7))
    shards = [Shard.parse(f"{k}/3") for k in (1, 2, 3)]
    assert [list(s.of(items)) for s in shards] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [s.size(len(items)) for s in shards] == [3, 2, 2]
    assert Shard.parse(" 2 / 3 ") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    assert list(Shard().of(items)) == items and Shard().whole


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_a_bad_shard_is_refused(text):
    with pytest.raises(ValueError, match=r"expected k/n with 1 ≤ k ≤ n"):
        Shard.parse(text)


def test_the_shards_of_a_command_write_the_rows_of_one_unsharded_run(tiny_corpus, tmp_path):
    model, tokenizer = build_tiny_model("llama", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")

    def run(output: str, shard: str | None = None) -> str:
        return lkv.commands.eval.evaluate(
            tasks=[tiny_needle_task(tiny_corpus, depths=(0.2, 0.4, 0.6, 0.8, 1.0))],
            methods=("fullkv", "streamingllm", "oracle"),
            press_args={"streamingllm": {"sink": 2}},
            budgets=(8, 16),
            settings=("aware", "agnostic"),
            output=str(tmp_path / output),
            model=str(tmp_path / "model"),
            progress=False,
            shard=shard,
        )

    run("whole")
    whole = {row_key(r): r["answer_ids"] for r in ResultsFile(tmp_path / "whole" / RESULTS_FILE).rows}
    samples = {key[1] for key in whole}
    assert len(samples) == 5
    seen = []
    for k in (1, 2):
        closing = run("sharded", f"{k}/2")
        assert closing.startswith(f"lkv eval: shard {k}/2 done;")
        assert PARTIAL_MARK in (tmp_path / "sharded" / REPORT_FILE).read_text()
        rows = ResultsFile(tmp_path / "sharded" / RESULTS_FILE).rows
        seen.append({r["sample"] for r in rows} - {s for shard in seen for s in shard})
    assert [len(s) for s in seen] == [3, 2]  # every 2nd sample from the k-th, disjoint
    sharded = {row_key(r): r["answer_ids"] for r in ResultsFile(tmp_path / "sharded" / RESULTS_FILE).rows}
    assert sharded == whole  # the same rows, answer for answer, each once
    assert len(ResultsFile(tmp_path / "sharded" / RESULTS_FILE).rows) == len(whole)
    closing = run("sharded")  # the command without --shard: no row to add, the complete report
    assert "result rows" in closing and PARTIAL_MARK not in (tmp_path / "sharded" / REPORT_FILE).read_text()
    assert len(ResultsFile(tmp_path / "sharded" / RESULTS_FILE).rows) == len(whole)
