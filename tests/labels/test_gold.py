"""The reference response of `lkv label --gold_answers` (lkv.labels.gold)."""

from __future__ import annotations

from lkv.labels.gold import missed, reference_response
from lkv.labels.prompts import Prompt

PASSAGE = "alpha beta gamma. The harbor conference will be held in Marrakesh. delta epsilon"


def fact(answer: str | None = "Marrakesh", evidence: str | None = None) -> Prompt:
    meta = {} if evidence is None else {"evidence": evidence}
    return Prompt("p0", [{"role": "user", "content": PASSAGE}], "test", "d0", "find_value", answer, meta)


def test_missed_only_a_checkable_answer_the_response_lacks(tiny_llama):
    _, tokenizer = tiny_llama
    right, wrong = (tokenizer(text, add_special_tokens=False).input_ids for text in ("in Marrakesh.", "Oslo"))
    assert missed(fact(), wrong, tokenizer)
    assert not missed(fact(), right, tokenizer)
    assert not missed(fact(answer=None), wrong, tokenizer)


def test_reference_is_the_shown_sentence_else_the_shown_answer_else_none(tiny_llama):
    _, tokenizer = tiny_llama
    sentence = "The harbor conference will be held in Marrakesh."
    end = tokenizer.eos_token_id

    def tokens(text: str, n: int = 64) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids[: n - 1] + [end]

    assert reference_response(fact(evidence=sentence), PASSAGE, tokenizer, end, 64) == tokens(sentence)
    assert reference_response(fact(evidence=sentence), PASSAGE, tokenizer, end, 4) == tokens(sentence, 4)
    assert reference_response(fact(), PASSAGE, tokenizer, end, 64) == tokens("Marrakesh")
    # truncation kept the answer but cut the start of its sentence: the answer alone
    cut = PASSAGE.replace("The harbor conference", "")
    assert reference_response(fact(evidence=sentence), cut, tokenizer, end, 64) == tokens("Marrakesh")
    # truncation cut the answer itself: nothing the model was shown states it
    assert (
        reference_response(fact(evidence=sentence), "alpha beta ... delta epsilon", tokenizer, end, 64)
        is None
    )
    assert reference_response(fact(answer=None), PASSAGE, tokenizer, end, 64) is None


def test_a_prompt_asking_several_facts_needs_every_answer_and_its_reference_states_each_shown_one(tiny_llama):
    _, tokenizer = tiny_llama
    first, second = (
        "The harbor conference will be held in Marrakesh.",
        "The last ferry to ember leaves at 9:35 pm.",
    )
    passage = f"alpha {first} beta {second} gamma"
    answers = [{"answer": "Marrakesh", "evidence": first}, {"answer": "9:35 pm", "evidence": second}]
    prompt = Prompt(
        "p1", [{"role": "user", "content": passage}], "test", "d0", "doc_qa", "x", {"answers": answers}
    )
    end = tokenizer.eos_token_id

    def tokens(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    assert missed(prompt, tokens("Marrakesh"), tokenizer)
    assert not missed(prompt, tokens("Marrakesh, then 9:35 pm"), tokenizer)
    assert reference_response(prompt, passage, tokenizer, end, 512) == tokens(f"{first} {second}") + [end]
    # truncation cut the second fact: the reference states the first alone
    assert reference_response(prompt, f"alpha {first} beta", tokenizer, end, 512) == tokens(first) + [end]
