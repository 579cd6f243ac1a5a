"""SentencePress: a share of the budget kept as whole sentences around the inner ranking's best tokens."""

import pytest
import torch

from lkv.eviction.compressor import Compressor
from lkv.eviction.decoding import DecodeTimePress, H2ODecode
from lkv.eviction.presses import LookaheadKVPress
from lkv.eviction.presses.lookahead_settings import LookaheadKVSettings
from lkv.eviction.presses.lookaheadkv import lookahead_press
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


def test_the_last_tokens_beyond_stand_alone_and_the_sentences_before_them_stay(tiny_llama):
    _, tokenizer = tiny_llama
    ids = tokenizer(
        "One fact. Two facts here. Three facts at the end, not split.", return_tensors="pt"
    ).input_ids
    ends = sentence_ends(tokenizer)
    whole = sentence_index(ids, ends)
    length = ids.shape[1]
    for beyond in (1, 4, length - 1):
        index = sentence_index(ids, ends, beyond)
        far = length - beyond
        assert (
            index[:far].tolist() == whole[:far].tolist()
        )  # sentences before the last `beyond` tokens unchanged
        assert (index[far:].diff() == 1).all() and index[far] > index[
            far - 1
        ]  # each of the last a sentence alone
    # sparing at least the whole prompt: every token alone, so the sentence ranking is the token ranking
    assert sentence_index(ids, ends, length).tolist() == list(range(length))
    assert sentence_index(ids, ends, 10 * length).tolist() == list(range(length))


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


@pytest.mark.parametrize("beyond", [0, PROMPT_LEN // 2])
def test_a_share_keeps_the_union_of_the_token_and_the_sentence_rankings(tiny_llama, beyond):
    """Half each: the kept set holds both rankings' top-k for the largest k that fits in C (as the fusion's
    union rule); the kept set differs from the inner press's own, with or without the prompt's end spared."""
    model, tokenizer = tiny_llama
    inner = build_press("probe", model)
    ids = prompt(model)
    ends = sentence_ends_every(model.config.vocab_size, 5)
    rows = _rows(inner, model, tokenizer, ids)
    lifted = sentence_rank(rows, sentence_index(ids, ends, beyond))
    got = _kept(SentencePress(inner, ends, 0.5, beyond), model, tokenizer, ids)
    for row, kept in enumerate(got):
        tops = [rows[row].argsort(descending=True, stable=True).tolist(), lifted[row].argsort().tolist()]
        k = max(k for k in range(PROMPT_LEN) if len(set(tops[0][:k]) | set(tops[1][:k])) <= BUDGET)
        assert set(tops[0][:k]) | set(tops[1][:k]) <= kept <= set(tops[0][: k + 1]) | set(tops[1][: k + 1])
    assert got != _kept(inner, model, tokenizer, ids)


def test_a_prompt_no_longer_than_beyond_is_kept_as_the_inner_press_keeps_it(tiny_llama):
    model, tokenizer = tiny_llama
    inner = build_press("probe", model)
    ids = prompt(model)
    ends = sentence_ends_every(model.config.vocab_size, 5)
    alone = _kept(inner, model, tokenizer, ids)
    assert _kept(SentencePress(inner, ends, 0.5, PROMPT_LEN), model, tokenizer, ids) == alone
    # sparing half of the prompt: the first half keeps its sentences, and they change what is kept
    assert _kept(SentencePress(inner, ends, 0.5, PROMPT_LEN // 2), model, tokenizer, ids) != alone


def test_a_scaled_share_is_the_share_times_the_far_part_of_the_prompt(tiny_llama):
    """``scaled``: an ``S``-token prompt's sentences get ``share · (S − beyond) / S`` of the budget; a prompt no
    longer than ``beyond`` gets none and is kept as the inner press keeps it."""
    model, tokenizer = tiny_llama
    inner = build_press("probe", model)
    ids = prompt(model)
    ends = sentence_ends_every(model.config.vocab_size, 5)
    for beyond in (PROMPT_LEN // 4, PROMPT_LEN // 2):
        scaled = SentencePress(inner, ends, 0.8, beyond, scaled=True)
        share = 0.8 * (PROMPT_LEN - beyond) / PROMPT_LEN
        assert scaled.prompt_share(PROMPT_LEN) == pytest.approx(share)
        fixed = _kept(SentencePress(inner, ends, share, beyond), model, tokenizer, ids)
        assert _kept(scaled, model, tokenizer, ids) == fixed
        assert fixed != _kept(SentencePress(inner, ends, 0.8, beyond), model, tokenizer, ids)
    spared = SentencePress(inner, ends, 0.8, PROMPT_LEN, scaled=True)
    assert spared.prompt_share(PROMPT_LEN) == 0
    assert _kept(spared, model, tokenizer, ids) == _kept(inner, model, tokenizer, ids)


def test_sentence_settings_are_checked(tiny_llama):
    model, tokenizer = tiny_llama
    press = build_press("lookaheadkv", model)
    with pytest.raises(ValueError, match=r"sentence share must be in \[0, 1\]"):
        SentencePress(press, sentence_ends(tokenizer), 1.5)
    with pytest.raises(ValueError, match="a sentence share of 0 keeps no sentence"):
        SentencePress(press, sentence_ends(tokenizer), 0.0)
    for beyond in (-1, 2.5, True):
        with pytest.raises(ValueError, match="sentences_beyond must be a whole number of tokens"):
            SentencePress(press, sentence_ends(tokenizer), 0.5, beyond)
    with pytest.raises(ValueError, match="sentences_beyond given without sentences > 0"):
        LookaheadKVSettings.of({"sentences_beyond": 512})
    with pytest.raises(ValueError, match="sentences_scaled scales the share .*give sentences_beyond > 0"):
        SentencePress(press, sentence_ends(tokenizer), 0.5, scaled=True)
    with pytest.raises(ValueError, match="sentences_scaled must be true or false, got 'yes'"):
        LookaheadKVSettings.of({"sentences": 0.5, "sentences_beyond": 8, "sentences_scaled": "yes"})
    with pytest.raises(ValueError, match="give the tokenizer"):
        lookahead_press(press.adapter, settings={"sentences": 0.5})
    wrapped = lookahead_press(press.adapter, None, {"sentences": 0.5, "sentences_beyond": 512}, tokenizer)
    assert isinstance(wrapped, SentencePress) and isinstance(wrapped.inner, LookaheadKVPress)
    assert (wrapped.beyond, wrapped.scaled) == (512, False)
    scaled = lookahead_press(
        press.adapter,
        None,
        {"sentences": 0.5, "sentences_beyond": 512, "sentences_scaled": True},
        tokenizer,
    )
    assert scaled.scaled and scaled.prompt_share(2048) == 0.375
    assert wrapped.streamable and wrapped.protected(PROMPT_LEN) == (0, 0)
    assert isinstance(lookahead_press(press.adapter, tokenizer=tokenizer), LookaheadKVPress)


def test_a_decode_time_method_ranks_as_its_prefill_press_at_each_budget(tiny_llama):
    """A sentence share under a decode-time policy is applied from its budget on, as it is alone."""
    model, tokenizer = tiny_llama
    inner = build_press("probe", model)
    ids = prompt(model)
    sentences = SentencePress(inner, sentence_ends_every(model.config.vocab_size, 5), 0.5, from_budget=BUDGET)
    wrapped = DecodeTimePress("sentences+h2o", sentences, H2ODecode())
    scores = _rows(inner, model, tokenizer, ids)
    for budget in (BUDGET - 1, BUDGET):
        want = sentences.budget_scores(scores, ids, budget)
        assert torch.equal(wrapped.budget_scores(scores, ids, budget), want)
        assert torch.equal(want, scores) == (budget < BUDGET)
