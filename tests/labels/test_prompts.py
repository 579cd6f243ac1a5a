"""Prompt sources, the document split and rendering (tiny corpus and tokenizer; no assets needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lkv.labels.prompts import (
    ESSAY_SOURCE,
    STDLIB_SOURCE,
    BuiltinPrompts,
    HFDatasetPrompts,
    JsonlPrompts,
    Prompt,
    render_prompt,
    split_by_document,
    stdlib_documents,
)
from lkv.model import assets

# The tiny corpus has 4 essays and 2 usable modules; at 0.5 both sides of the split hold some of each.
HALF = 0.5


def builtin(corpus: tuple[Path, Path], **kwargs) -> BuiltinPrompts:
    essays, stdlib = corpus
    settings = {"num_prompts": 24, "min_words": 40, "max_words": 120, "heldout_fraction": HALF}
    return BuiltinPrompts(essays_dir=str(essays), stdlib_dir=str(stdlib), **{**settings, **kwargs})


def user_prompt(content: str, prompt_id: str = "p1") -> Prompt:
    return Prompt(
        id=prompt_id, messages=[{"role": "user", "content": content}], source="test", doc_id="d", kind="chat"
    )


# --- split_by_document -------------------------------------------------------------------------------------


def test_split_is_disjoint_complete_and_near_the_fraction():
    docs = [f"doc-{i}" for i in range(2000)]
    train, heldout = split_by_document(docs, 0.2)
    assert train.isdisjoint(heldout)
    assert train | heldout == set(docs)
    assert 0.17 < len(heldout) / len(docs) < 0.23


def test_split_is_stable_when_documents_are_added():
    docs = [f"doc-{i}" for i in range(300)]
    train, heldout = split_by_document(docs, 0.3)
    more_train, more_heldout = split_by_document(docs + [f"new-{i}" for i in range(300)], 0.3)
    assert train <= more_train and heldout <= more_heldout


def test_split_depends_on_salt_and_validates_fraction():
    docs = [f"doc-{i}" for i in range(200)]
    assert split_by_document(docs, 0.5, salt="a") != split_by_document(docs, 0.5, salt="b")
    assert split_by_document(docs, 0.0) == (set(docs), set())
    with pytest.raises(ValueError, match=r"heldout_fraction must be in \[0, 1\], got 1.5"):
        split_by_document(docs, 1.5)


# --- BuiltinPrompts ----------------------------------------------------------------------------------------


def test_builtin_is_deterministic_for_a_seed(tiny_corpus):
    first = [(p.id, p.messages, p.answer) for p in builtin(tiny_corpus, seed=3)]
    again = [(p.id, p.messages, p.answer) for p in builtin(tiny_corpus, seed=3)]
    other = [(p.id, p.messages, p.answer) for p in builtin(tiny_corpus, seed=4)]
    assert first == again
    assert first != other
    assert len({pid for pid, _, _ in first}) == len(first)


def test_builtin_shorter_run_is_a_prefix_of_a_longer_one(tiny_corpus):
    short = [p.id for p in builtin(tiny_corpus, num_prompts=5)]
    long = [p.id for p in builtin(tiny_corpus, num_prompts=12)]
    assert long[:5] == short


def test_builtin_splits_never_share_a_document(tiny_corpus):
    train = {p.doc_id for p in builtin(tiny_corpus, split="train", num_prompts=40, code_fraction=0.5)}
    heldout = {p.doc_id for p in builtin(tiny_corpus, split="heldout", num_prompts=40, code_fraction=0.5)}
    assert train and heldout and train.isdisjoint(heldout)
    all_docs = [f"{ESSAY_SOURCE}/{n}" for n in ("alpha", "beta", "gamma", "delta")]
    all_docs += [f"{STDLIB_SOURCE}/shapes.py", f"{STDLIB_SOURCE}/pkg/queueing.py"]
    expected_train, expected_heldout = split_by_document(all_docs, HALF)
    assert train <= expected_train and heldout <= expected_heldout


def test_builtin_varies_instruction_families_and_sources(tiny_corpus):
    prompts = list(builtin(tiny_corpus, num_prompts=60, code_fraction=0.5, retrieval_fraction=0.2))
    assert {p.kind for p in prompts} == {"summarize", "question", "extract", "code", "find_value"}
    assert {p.source for p in prompts} == {ESSAY_SOURCE, STDLIB_SOURCE}
    assert len({p.messages[0]["content"].split("\n\n")[-1] for p in prompts}) > 15  # many phrasings
    for prompt in prompts:
        assert [m["role"] for m in prompt.messages] == ["user"]
        assert prompt.kind != "code" or prompt.source == STDLIB_SOURCE


def test_builtin_passages_end_at_sentence_or_line_boundaries(tiny_corpus):
    for prompt in builtin(tiny_corpus, num_prompts=30, code_fraction=0.5, retrieval_fraction=0.0):
        content = prompt.messages[0]["content"]
        if prompt.source == STDLIB_SOURCE:
            code = re.search(r"```python\n(.*)\n```", content, re.DOTALL).group(1)
            first = code.splitlines()[0]
            assert first[:1].isalpha() or first.startswith(("@", "#"))  # a top-level statement
        else:
            passage = max(content.split("\n\n"), key=len)
            assert passage[-1] in ".!?" and passage[0].isupper()
        assert prompt.meta["words"] >= 40


def test_find_value_prompts_contain_their_answer(tiny_corpus):
    prompts = list(builtin(tiny_corpus, num_prompts=20, code_fraction=0.5, retrieval_fraction=1.0))
    assert {p.kind for p in prompts} == {"find_value"}
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert re.fullmatch(r"\d{7}", prompt.answer)
        assert content.count(prompt.answer) == 1
        fact = next(line for line in content.splitlines() if prompt.answer in line)
        key = re.search(r"(?:for|of the) (\w+)(?: vault)? is", fact).group(1)
        assert content.count(key) >= 2  # once in the fact, once in the question
        assert 0.0 <= prompt.meta["depth"] <= 1.0


def test_builtin_defaults_read_the_cached_assets(tiny_corpus, monkeypatch):
    essays, stdlib = tiny_corpus
    monkeypatch.setattr(assets, "essays_dir", lambda fetch=True: essays)
    monkeypatch.setattr(assets, "stdlib_dir", lambda: stdlib)
    prompts = list(BuiltinPrompts(num_prompts=6, min_words=40, max_words=80, heldout_fraction=HALF))
    assert len(prompts) == 6


def test_stdlib_documents_skip_tests(tiny_corpus):
    docs = stdlib_documents(tiny_corpus[1])
    assert sorted(docs) == [f"{STDLIB_SOURCE}/pkg/queueing.py", f"{STDLIB_SOURCE}/shapes.py"]


def test_builtin_describe_names_its_settings(tiny_corpus):
    text = builtin(tiny_corpus, seed=7, split="heldout").describe()
    assert "seed=7" in text and "split=heldout" in text and "words=40..120" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_words": 50, "max_words": 10}, "min_words ≤ max_words"),
        ({"code_fraction": 1.2}, "code_fraction must be in"),
        ({"split": "test"}, "split must be 'train' or 'heldout'"),
    ],
)
def test_builtin_rejects_bad_settings(tiny_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        builtin(tiny_corpus, **kwargs)


def test_builtin_without_long_enough_documents_says_so(tiny_corpus):
    with pytest.raises(ValueError, match=r"no paul-graham-essays document of at least min_words=100000"):
        list(builtin(tiny_corpus, min_words=100_000, max_words=100_000))


# --- render_prompt -----------------------------------------------------------------------------------------


def test_render_applies_the_chat_template(tiny_tokenizer):
    ids = render_prompt(user_prompt("hello there"), tiny_tokenizer, max_prompt_tokens=1000)
    text = tiny_tokenizer.decode(ids)
    assert text == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"


LONG = "BEGINMARK " + " ".join(f"word{i}" for i in range(300)) + " ENDMARK"


def test_render_middle_truncation_keeps_both_ends(tiny_tokenizer):
    full = render_prompt(user_prompt(LONG), tiny_tokenizer, max_prompt_tokens=100_000)
    ids = render_prompt(user_prompt(LONG), tiny_tokenizer, max_prompt_tokens=120)
    assert len(full) > 120 >= len(ids) > 110
    text = tiny_tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nBEGINMARK")
    assert text.endswith("ENDMARK<|im_end|>\n<|im_start|>assistant\n")


def test_render_left_truncation_keeps_the_end(tiny_tokenizer):
    ids = render_prompt(user_prompt(LONG), tiny_tokenizer, max_prompt_tokens=120, truncation="left")
    text = tiny_tokenizer.decode(ids)
    assert len(ids) <= 120 and "BEGINMARK" not in text
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("ENDMARK<|im_end|>\n<|im_start|>assistant\n")


def test_render_truncates_the_longest_user_turn_only(tiny_tokenizer):
    prompt = Prompt(
        id="multi",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": LONG}],
        source="test",
        doc_id="d",
        kind="chat",
    )
    text = tiny_tokenizer.decode(render_prompt(prompt, tiny_tokenizer, max_prompt_tokens=150))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nBEGINMARK")


def test_render_skip_returns_none(tiny_tokenizer):
    assert render_prompt(user_prompt(LONG), tiny_tokenizer, max_prompt_tokens=120, truncation="skip") is None


def test_render_error_names_id_length_and_limit(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"prompt 'long-1' is \d+ tokens, over max_prompt_tokens=120"):
        render_prompt(user_prompt(LONG, "long-1"), tiny_tokenizer, max_prompt_tokens=120, truncation="error")


def test_render_rejects_empty_and_unfittable_prompts(tiny_tokenizer):
    with pytest.raises(ValueError, match="prompt 'p1' is empty"):
        render_prompt(user_prompt("   "), tiny_tokenizer, max_prompt_tokens=100)
    with pytest.raises(ValueError, match="does not fit max_prompt_tokens=5"):
        render_prompt(user_prompt(LONG), tiny_tokenizer, max_prompt_tokens=5)


def test_render_renders_builtin_prompts(tiny_corpus, tiny_tokenizer):
    for prompt in builtin(tiny_corpus, num_prompts=8, code_fraction=0.5):
        ids = render_prompt(prompt, tiny_tokenizer, max_prompt_tokens=256)
        assert 0 < len(ids) <= 256


# --- JSONL and HF datasets ---------------------------------------------------------------------------------


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
