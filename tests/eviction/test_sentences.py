"""SentencePress: a share of the budget kept as whole sentences around the inner ranking's best tokens."""

import pytest
import torch

from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress
from lkv.eviction.presses.fused import lookahead_press
from lkv.eviction.presses.sentences import SentencePress, sentence_ends, sentence_index, sentence_rank
from tests.eviction.conftest import PROMPT_LEN, build_press, prompt, sentence_ends_every

BUDGET = 12


def test_sentence_ends_are_the_tokens_with_a_full_stop_or_a_line_break(tiny_llama):
    _, tokenizer = tiny_llama
    ends = sentence_ends(tokenizer)
    ids = tokenizer("The code is 42. Keep it\nsafe", return_tensors="pt").input_ids
    texts = [tokenizer.decode([token]) for token in ids[0]]
    assert [bool(ends[token]) for token in ids[0]] == [("." in t or "\n" in t) for t in texts]
    assert any(ends[token] for token in ids[0])
    index = sentence_index(ids, ends)
    # the sentence ends with its stop: the next token opens the next sentence
    stop = next(i for i, t in enumerate(texts) if "." in t)
    assert index[stop] == 0 and index[stop + 1] == 1 and index[-1] == 2
    with pytest.raises(ValueError, match="outside the .*-token vocabulary"):
        sentence_index(torch.tensor([[len(ends)]]), ends)


def _reference_rank(scores: list[float], sentence: list[int]) -> list[int]:
    """Slow reference: positions sorted by (best own rank in their sentence, own rank) → rank of each."""
    own = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    own_rank = {p: r for r, p in enumerate(own)}
    best = {s: min(own_rank[p] for p in range(len(scores)) if sentence[p] == s) for s in set(sentence)}
    order = sorted(range(len(scores)), key=lambda p: (best[sentence[p]], own_rank[p]))
    return [order.index(p) for p in range(len(scores))]


def test_sentence_rank_matches_a_slow_reference():
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(2, 3, 40, generator=generator).round(decimals=1)  # ties, broken by position
    sentence = (torch.rand(40, generator=generator) < 0.2).long().cumsum(0)
    got = sentence_rank(scores, sentence)
    for row in range(2):
        for head in range(3):
            want = _reference_rank(scores[row, head].tolist(), sentence.tolist())
            assert got[row, head].tolist() == want


def _kept(press, model, tokenizer, ids) -> list[set[int]]:
    kept = Compressor(model, tokenizer, press, BUDGET).compress(ids).kept
    return [set(row.tolist()) for layer in kept for row in layer.reshape(-1, layer.shape[-1])]


def _rows(press, model, tokenizer, ids) -> torch.Tensor:
    return Compressor(model, tokenizer, press, BUDGET).score(ids).scores.reshape(-1, PROMPT_LEN)


def test_all_budget_to_sentences_keeps_whole_sentences_from_the_best_tokens_one(tiny_llama):
    model, tokenizer = tiny_llama
    inner = LookaheadKVPress(build_press("lookaheadkv", model).adapter, kernel=1)
    ids = prompt(model)
    ends = sentence_ends_every(model.config.vocab_size, 7)
    sentence = sentence_index(ids, ends)
    members = [set(torch.nonzero(sentence == s).flatten().tolist()) for s in range(int(sentence.max()) + 1)]
    rows = _rows(inner, model, tokenizer, ids)
    for row, kept in zip(rows, _kept(SentencePress(inner, ends, 1.0), model, tokenizer, ids), strict=True):
        best = members[int(sentence[row.argmax()])]
        assert best <= kept or kept <= best  # the best token's sentence first, whole if it fits
        partial = [s for s in members if s & kept and not s <= kept]
        assert len(partial) <= 1, "more than one sentence kept in part"


def test_a_share_keeps_the_union_of_the_token_and_the_sentence_rankings(tiny_llama):
    """Half each: the kept set holds both rankings' top-k for the largest k that fits in C (as the fusion's
    union rule); the kept set differs from the inner press's own."""
    model, tokenizer = tiny_llama
    inner = build_press("probe", model)
    ids = prompt(model)
    ends = sentence_ends_every(model.config.vocab_size, 5)
    rows = _rows(inner, model, tokenizer, ids)
    lifted = sentence_rank(rows, sentence_index(ids, ends))
    got = _kept(SentencePress(inner, ends, 0.5), model, tokenizer, ids)
    for row, kept in enumerate(got):
        tops = [rows[row].argsort(descending=True, stable=True).tolist(), lifted[row].argsort().tolist()]
        k = max(k for k in range(PROMPT_LEN) if len(set(tops[0][:k]) | set(tops[1][:k])) <= BUDGET)
        assert set(tops[0][:k]) | set(tops[1][:k]) <= kept <= set(tops[0][: k + 1]) | set(tops[1][: k + 1])
    assert got != _kept(inner, model, tokenizer, ids)


def test_sentence_settings_are_checked(tiny_llama):
    model, tokenizer = tiny_llama
    press = build_press("lookaheadkv", model)
    with pytest.raises(ValueError, match=r"sentence share must be in \[0, 1\]"):
        SentencePress(press, sentence_ends(tokenizer), 1.5)
    with pytest.raises(ValueError, match="a sentence share of 0 keeps no sentence"):
        SentencePress(press, sentence_ends(tokenizer), 0.0)
    with pytest.raises(ValueError, match="give the tokenizer"):
        lookahead_press(press.adapter, sentences=0.5)
    wrapped = lookahead_press(press.adapter, sentences=0.5, tokenizer=tokenizer)
    assert isinstance(wrapped, SentencePress) and isinstance(wrapped.inner, LookaheadKVPress)
    assert wrapped.streamable and wrapped.protected(PROMPT_LEN) == (0, 0)
    assert isinstance(lookahead_press(press.adapter, tokenizer=tokenizer), LookaheadKVPress)
