"""Prompts from JSONL files and HF datasets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lkv.labels.dataset_prompts import HFDatasetPrompts, JsonlPrompts


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_reads_messages_and_prompt_lines(tmp_path):
    path = write_lines(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "What is 2+2?", "answer": "4", "kind": "math"}),
            "",
            json.dumps(
                {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello!"},
                    ],
                    "doc_id": "doc-7",
                }
            ),
        ],
    )
    first, second = list(JsonlPrompts(str(path)))
    assert (first.id, first.kind, first.answer, first.doc_id) == ("mine-1", "math", "4", "mine-1")
    assert first.messages == [{"role": "user", "content": "What is 2+2?"}]
    assert second.id == "mine-3" and second.doc_id == "doc-7" and second.source == "jsonl:mine.jsonl"
    assert [m["role"] for m in second.messages] == ["system", "user"]  # the trailing answer is dropped


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok"}), "", "{not json"])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:3: not valid JSON"):
        list(JsonlPrompts(str(path)))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"text": "hi"}, r":1: expected a 'messages' list or a 'prompt' string, found keys \['text'\]"),
        ({"messages": [{"role": "bot", "content": "x"}]}, r":1: messages\[0\] has role 'bot'"),
        ({"messages": [{"role": "user"}]}, r":1: messages\[0\] must be \{'role': str, 'content': str\}"),
        ({"prompt": 3}, r":1: field 'prompt' must be str or list, found int"),
        ({"prompt": "  "}, r":1: prompt has no non-empty user turn"),
    ],
)
def test_jsonl_invalid_records(tmp_path, record, message):
    path = write_lines(tmp_path / "x.jsonl", [json.dumps(record)])
    with pytest.raises(ValueError, match=message):
        list(JsonlPrompts(str(path)))


def test_jsonl_id_field_and_duplicates(tmp_path):
    path = write_lines(
        tmp_path / "ids.jsonl",
        [json.dumps({"uid": "a", "prompt": "x"}), json.dumps({"uid": "a", "prompt": "y"})],
    )
    with pytest.raises(ValueError, match=r":2: id 'a' already used on line 1"):
        list(JsonlPrompts(str(path), id_field="uid"))


def test_hf_dataset_from_local_files(tmp_path):
    from datasets import Dataset

    rows = [
        {
            "uid": f"r{i}",
            "document": f"Document number {i}.",
            "messages": [{"role": "user", "content": f"Q{i}?"}],
        }
        for i in range(5)
    ]
    folder = tmp_path / "parquet"
    folder.mkdir()
    Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    prompts = list(HFDatasetPrompts(str(folder), id_field="uid", context_field="document", limit=3))
    assert [p.id for p in prompts] == ["r0", "r1", "r2"]
    assert prompts[1].messages[0]["content"] == "Document number 1.\n\nQ1?"
    assert len({p.doc_id for p in prompts}) == 3 and prompts[0].doc_id.startswith("context-")

    jsonl = write_lines(tmp_path / "rows.jsonl", [json.dumps({"prompt": "hello"})])
    (prompt,) = HFDatasetPrompts(str(jsonl), streaming=True)
    assert prompt.id == "rows.jsonl-train-0" and prompt.messages == [{"role": "user", "content": "hello"}]
