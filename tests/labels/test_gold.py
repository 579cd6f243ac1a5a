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
