"""Sentences: a share of the budget kept as whole sentences, so a kept value keeps the words that say what it is.

A ranking that keeps a value's tokens may drop the sentence that names the value, and the model then answers
with a description of the value rather than the value. :class:`SentencePress` lifts its inner press's ranking
to sentences (a sentence ranks by its best token; inside a sentence, tokens keep their own order) and merges
that with the token ranking by the union rule (:func:`~lkv.eviction.selector.union`): the top ``C`` holds the
inner press's best tokens and the whole sentences around its best ones, ``share`` of ``C`` the sentences'. A
sentence ends at a token whose text holds ``.``, ``!``, ``?`` or a line break (:data:`SENTENCE_ENDS`), so in
code a line is a sentence.

With ``beyond`` > 0 only positions more than ``beyond`` tokens before the end of the prompt form sentences; the
last ``beyond`` tokens each stand alone, so there the sentence ranking is the token ranking: sentences lend
reach to far tokens, while near the end the token ranking alone already keeps what the answer reads. A prompt
no longer than ``beyond`` is kept exactly as the inner press keeps it. With ``scaled`` the share is
``share · (S − beyond) / S`` for an ``S``-token prompt: the sentences get the part of the budget that the
prompt's far part is of the prompt, so a prompt barely longer than ``beyond`` keeps nearly all of its budget for
the token ranking, and a prompt many times ``beyond`` nearly all of ``share``. With ``from_budget`` > 0 a budget
below it is ranked by the inner press alone: a small budget holds too few tokens to spend some on sentences.

The merge depends on the budget, so it is applied when the scores are ranked for one
(:meth:`SentencePress.budget_scores`); :meth:`SentencePress.score` gives the inner press's scores.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from lkv.core.attention import AttentionCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext
from lkv.eviction.selector import descending_rank, union

SENTENCE_ENDS = (".", "!", "?", "\n", "。", "！", "？")
"""Characters that end a sentence when a token's text holds one."""


def sentence_ends(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """``(len(tokenizer),)`` bool: whether each token's text holds one of :data:`SENTENCE_ENDS`."""
    texts = tokenizer.batch_decode([[token] for token in range(len(tokenizer))])
    return torch.tensor([any(end in text for end in SENTENCE_ENDS) for text in texts])


def sentence_index(prompt_ids: torch.Tensor, ends: torch.Tensor, beyond: int = 0) -> torch.Tensor:
    """``(1, S)`` prompt tokens → ``(S,)`` int64: each position's sentence, counted from 0 (a token that ends a
    sentence belongs to it); each of the last ``beyond`` positions is a sentence of its own."""
    if int(prompt_ids.max()) >= len(ends):
        raise ValueError(
            f"prompt token id {int(prompt_ids.max())} is outside the {len(ends)}-token vocabulary the sentence "
            "ends were read from: build them from the tokenizer that made the prompt"
        )
    closes = ends.to(prompt_ids.device)[prompt_ids[0]].long()
    if beyond > 0:  # the token before the last `beyond` closes its sentence, and each of those closes its own
        closes[max(0, closes.shape[0] - beyond - 1) :] = 1
    return closes.cumsum(0) - closes


def sentence_rank(scores: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
    """``(..., S)`` scores and ``(S,)`` sentence indices → ``(..., S)`` float ranks (0 = first kept): sentences
    in the order of their best-ranked token, and inside a sentence its tokens by their own rank."""
    rank = descending_rank(scores).long()
    length = scores.shape[-1]
    index = sentence.expand_as(rank)
    best = torch.full_like(rank, length).scatter_reduce(-1, index, rank, "amin", include_self=True)
    key = best.gather(-1, index) * length + rank  # unique: rank is a permutation of 0..S−1 per row
    return key.argsort(dim=-1).argsort(dim=-1).float()


class SentencePress(Press):
    """Scores ``(1, layers, kv_heads, S)``: the inner press's; ranked at a budget ``C ≥ from_budget`` as
    ``union([inner, −sentence_rank(inner)], [1 − share, share])`` (module docstring).

    Args:
        inner: the press whose ranking is lifted to sentences.
        ends: ``(vocab,)`` bool, the tokens that end a sentence (:func:`sentence_ends`).
        share: the share of the budget ranked by whole sentences, in ``(0, 1]`` (1: sentences only).
        beyond: tokens at the end of the prompt that stay single tokens (0: sentences everywhere).
        scaled: the share scaled by the far part of the prompt, ``share · (S − beyond) / S`` (needs ``beyond``).
        from_budget: the smallest per-head budget the share applies at (0: every budget).
    """

    def __init__(
        self,
        inner: Press,
        ends: torch.Tensor,
        share: float,
        beyond: int = 0,
        scaled: bool = False,
        from_budget: int = 0,
    ) -> None:
        check_share(share, beyond, scaled)
        if share == 0:
            raise ValueError("a sentence share of 0 keeps no sentence: use the inner press alone")
        self.inner = inner
        self.ends = ends
        self.share = float(share)
        self.beyond = beyond
        self.scaled = scaled
        self.from_budget = from_budget
        self.name = inner.name
        self.streamable = inner.streamable

    def prompt_share(self, prompt_len: int) -> float:
        """The share of a ``prompt_len``-token prompt's budget ranked by whole sentences."""
        if not self.scaled:
            return self.share
        return self.share * max(0, prompt_len - self.beyond) / prompt_len

    def prefill_capture(self, prompt_len: int) -> AttentionCapture | None:
        return self.inner.prefill_capture(prompt_len)

    def score(self, ctx: PressContext) -> torch.Tensor:
        return self.inner.score(ctx)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        return self.inner.layer_scorer(ctx)

    def budget_scores(self, scores: torch.Tensor, prompt_ids: torch.Tensor, budget: int) -> torch.Tensor:
        """``scores (1, [layers,] kv_heads, S)`` merged with their sentence ranking at ``budget ≥ from_budget``."""
        scores = self.inner.budget_scores(scores, prompt_ids, budget)
        if budget < self.from_budget:
            return scores
        sentence = sentence_index(prompt_ids, self.ends, self.beyond)
        share = self.prompt_share(prompt_ids.shape[1])
        return union([scores, -sentence_rank(scores, sentence)], [1 - share, share])

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return self.inner.protected(prompt_len)

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        return self.inner.layer_budgets(budget, prompt_len, num_layers)


def check_share(share: float, beyond: int = 0, scaled: bool = False) -> None:
    """Raise a clear error unless ``0 ≤ share ≤ 1`` (0: no sentences) and ``beyond`` is a count of tokens ≥ 0,
    given only with a share (without one it would change nothing), and ``scaled`` only with ``beyond`` (it
    scales the share by the part of the prompt before the last ``beyond`` tokens)."""
    if not 0 <= share <= 1:
        raise ValueError(f"the sentence share must be in [0, 1] (a share of the budget), got {share}")
    if isinstance(beyond, bool) or not isinstance(beyond, int) or beyond < 0:
        raise ValueError(f"sentences_beyond must be a whole number of tokens ≥ 0, got {beyond!r}")
    if beyond and not share:
        raise ValueError(
            f"sentences_beyond {beyond} spares the prompt's end from sentences: give sentences > 0"
        )
    if not isinstance(scaled, bool):
        raise ValueError(f"sentences_scaled must be true or false, got {scaled!r}")
    if scaled and not beyond:
        raise ValueError(
            "sentences_scaled scales the share by the part of the prompt before the last sentences_beyond tokens: "
            "give sentences_beyond > 0"
        )
