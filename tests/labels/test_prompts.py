"""The Prompt schema, the document split, the embedded corpora and rendering (tiny corpus and tokenizer)."""

from __future__ import annotations

import pytest

from lkv.labels.prompts import (
    STDLIB_SOURCE,
    Prompt,
    render_prompt,
    split_by_document,
    stdlib_documents,
)


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


def test_stdlib_documents_skip_tests(tiny_corpus):
    docs = stdlib_documents(tiny_corpus[1])
    assert sorted(docs) == [f"{STDLIB_SOURCE}/pkg/queueing.py", f"{STDLIB_SOURCE}/shapes.py"]


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
