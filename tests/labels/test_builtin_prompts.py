"""Built-in essay and code prompts (tiny corpus and tokenizer; no assets needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.prompts import ESSAY_SOURCE, STDLIB_SOURCE, render_prompt, split_by_document
from lkv.model import assets

# The tiny corpus has 4 essays and 2 usable modules; at 0.5 both sides of the split hold some of each.
HALF = 0.5


def builtin(corpus: tuple[Path, Path], **kwargs) -> BuiltinPrompts:
    essays, stdlib = corpus
    settings = {"num_prompts": 24, "min_words": 40, "max_words": 120, "heldout_fraction": HALF}
    return BuiltinPrompts(essays_dir=str(essays), stdlib_dir=str(stdlib), **{**settings, **kwargs})


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
        # the sentence stating it (a code prompt's comment), which `lkv label --gold_answers` teacher-forces
        assert prompt.answer in prompt.meta["evidence"] and prompt.meta["evidence"] in fact
        key = re.search(r"(?:for|of the) (\w+)(?: vault)? is", fact).group(1)
        assert content.count(key) >= 2  # once in the fact, once in the question
        assert 0.0 <= prompt.meta["depth"] <= 1.0


def test_fact_depths_put_the_facts_early_in_the_passage(tiny_corpus):
    default = list(builtin(tiny_corpus, num_prompts=30, retrieval_fraction=1.0))
    early = list(builtin(tiny_corpus, num_prompts=30, retrieval_fraction=1.0, fact_depths=(0.0, 0.3)))
    assert max(p.meta["depth"] for p in early) <= 0.32 < max(p.meta["depth"] for p in default)
    # the same passages and facts, only moved: a default-range run draws what it always drew
    assert [p.answer for p in early] == [p.answer for p in default]
    assert [p.id for p in builtin(tiny_corpus, fact_depths=(0.0, 1.0))] == [
        p.id for p in builtin(tiny_corpus)
    ]
    assert "fact_depths=[0.0, 0.3]" in builtin(tiny_corpus, fact_depths=(0.0, 0.3)).describe()


def test_distractor_facts_share_the_format_but_only_the_asked_key_is_asked(tiny_corpus):
    default = list(builtin(tiny_corpus, num_prompts=12, retrieval_fraction=1.0))
    prompts = list(builtin(tiny_corpus, num_prompts=12, retrieval_fraction=1.0, distractor_facts=3))
    # the passage and the asked fact are the default's; without distractors nothing is drawn for them
    assert [p.answer for p in prompts] == [p.answer for p in default]
    assert [p.id for p in builtin(tiny_corpus, distractor_facts=0)] == [p.id for p in builtin(tiny_corpus)]
    for prompt, plain in zip(prompts, default, strict=True):
        content = prompt.messages[0]["content"]
        # a fact is a sentence in prose, a comment line in code
        facts = [f.strip().removeprefix("# ") for f in re.findall(r"[^.\n]*\b\d{7}\b[^.\n]*", content)]
        assert len(facts) == 4 and len(set(facts)) == 4 and content.count(prompt.answer) == 1
        asked = next(f for f in facts if prompt.answer in f)
        template = re.sub(r"\d{7}", "#", re.sub(r"(for|of the) \w+", r"\1 K", asked))
        assert all(re.sub(r"\d{7}", "#", re.sub(r"(for|of the) \w+", r"\1 K", f)) == template for f in facts)
        key = re.search(r"(?:for|of the) (\w+)", asked).group(1)
        others = {re.search(r"(?:for|of the) (\w+)", f).group(1) for f in facts} - {key}
        question = content.split("\n\n")[-1] if "question" in prompt.meta else content.split("\n\n")[0]
        assert key in question and len(others) == 3 and not any(k in question for k in others)
        assert plain.answer == prompt.answer
        assert prompt.meta["distractors"] == 3 and 0.0 <= prompt.meta["depth"] <= 1.0
    assert "distractor_facts=3" in builtin(tiny_corpus, distractor_facts=3).describe()
    with pytest.raises(ValueError, match="distractor_facts must be in"):
        builtin(tiny_corpus, distractor_facts=-1)


def test_builtin_defaults_read_the_cached_assets(tiny_corpus, monkeypatch):
    essays, stdlib = tiny_corpus
    monkeypatch.setattr(assets, "essays_dir", lambda fetch=True: essays)
    monkeypatch.setattr(assets, "stdlib_dir", lambda: stdlib)
    prompts = list(BuiltinPrompts(num_prompts=6, min_words=40, max_words=80, heldout_fraction=HALF))
    assert len(prompts) == 6


def test_builtin_describe_names_its_settings(tiny_corpus):
    text = builtin(tiny_corpus, seed=7, split="heldout").describe()
    assert "seed=7" in text and "split=heldout" in text and "words=40..120" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_words": 50, "max_words": 10}, "min_words ≤ max_words"),
        ({"code_fraction": 1.2}, "code_fraction must be in"),
        ({"split": "test"}, "split must be 'train' or 'heldout'"),
        ({"fact_depths": (0.6, 0.2)}, "fact_depths must be"),
    ],
)
def test_builtin_rejects_bad_settings(tiny_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        builtin(tiny_corpus, **kwargs)


def test_builtin_without_long_enough_documents_says_so(tiny_corpus):
    with pytest.raises(ValueError, match=r"no paul-graham-essays document of at least min_words=100000"):
        list(builtin(tiny_corpus, min_words=100_000, max_words=100_000))


# --- render_prompt -----------------------------------------------------------------------------------------


def test_render_renders_builtin_prompts(tiny_corpus, tiny_tokenizer):
    for prompt in builtin(tiny_corpus, num_prompts=8, code_fraction=0.5):
        ids = render_prompt(prompt, tiny_tokenizer, max_prompt_tokens=256)
        assert 0 < len(ids) <= 256


# --- JSONL and HF datasets ---------------------------------------------------------------------------------
