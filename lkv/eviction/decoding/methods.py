"""Decode-time methods: a prefill press paired with the policy that keeps working while decoding.

:func:`h2o_decode`, :func:`scissorhands` and :func:`quest` (registered under their names in
:mod:`lkv.eviction.registry`) build a :class:`DecodeTimePress`: a press in every respect (the evaluation runner prefills, scores and evicts it like any other), whose
``decode_policy`` :class:`lkv.eviction.compressor.Compressor` then applies while generating.
"""

from __future__ import annotations

import torch

from lkv.core.attention import ImportanceCapture
from lkv.eviction.decoding.base import DecodePolicy
from lkv.eviction.decoding.h2o import H2ODecode
from lkv.eviction.decoding.quest import QuestAttention
from lkv.eviction.decoding.scissorhands import ScissorhandsDecode, ScissorhandsPress
from lkv.eviction.presses import FullKVPress, H2OPress, Press, PressContext


class DecodeTimePress(Press):
    """A prefill press (scores for the prompt's eviction) and a decode-time policy, under one method name.

    As published, H2O and Scissorhands apply one rule to the whole sequence, so the prompt's eviction also
    keeps the policy's recent window (:meth:`DecodePolicy.prompt_window`, applied by the Compressor).

    Args:
        name: the method's name (result rows, reports).
        press: scores the prompt.
        decode_policy: looks after the cache while decoding.
    """

    def __init__(self, name: str, press: Press, decode_policy: DecodePolicy) -> None:
        self.name = name
        self.press = press
        self.decode_policy = decode_policy

    def prefill_capture(self, prompt_len: int) -> ImportanceCapture | None:
        return self.press.prefill_capture(prompt_len)

    def score(self, ctx: PressContext) -> torch.Tensor:
        return self.press.score(ctx)

    def budget_scores(self, scores: torch.Tensor, prompt_ids: torch.Tensor, budget: int) -> torch.Tensor:
        return self.press.budget_scores(scores, prompt_ids, budget)

    def protected(self, prompt_len: int) -> tuple[int, int]:
        return self.press.protected(prompt_len)

    def layer_budgets(self, budget: int, prompt_len: int, num_layers: int) -> list[int]:
        return self.press.layer_budgets(budget, prompt_len, num_layers)


def h2o_decode(**kwargs) -> DecodeTimePress:
    """H2O as published: prompt by accumulated attention, then H2O at every step
    (:class:`~lkv.eviction.decoding.h2o.H2ODecode`: ``budget``, ``every``, ``recent``)."""
    # The prompt window comes from the policy (a fraction of the budget), not from the press.
    return DecodeTimePress("h2o-decode", H2OPress(recent=0), H2ODecode(**kwargs))


def scissorhands(**kwargs) -> DecodeTimePress:
    """Scissorhands (:class:`~lkv.eviction.decoding.scissorhands.ScissorhandsDecode`: ``budget``, ``every``,
    ``recent``, ``history``)."""
    policy = ScissorhandsDecode(**kwargs)
    return DecodeTimePress("scissorhands", ScissorhandsPress(policy.history), policy)


def quest(**kwargs) -> DecodeTimePress:
    """Quest page selection (:class:`~lkv.eviction.decoding.quest.QuestAttention`: ``budget``, ``page_size``,
    ``dense_layers``)."""
    # Nothing is evicted: Quest keeps the full cache and only narrows each step's attention.
    return DecodeTimePress("quest", FullKVPress(), QuestAttention(**kwargs))
