"""Decode-time methods: policies that act while tokens are generated, composable with any prefill method.

    from lkv.eviction.decoding import H2ODecode
    from lkv.eviction.registry import make_method
    from lkv.eviction.compressor import Compressor

    Compressor(model, tokenizer, "h2o-decode", budget=128)                      # H2O as published
    Compressor(model, tokenizer, lookahead, budget=128, decode_policy=H2ODecode(every=16))   # LookaheadKV + H2O upkeep
    Compressor(model, tokenizer, make_method("quest", page_size=16), budget=128)  # Quest (no memory saved)

Eviction policies (:class:`H2ODecode`, :class:`ScissorhandsDecode`) keep every layer within its budget
between decoding steps, generated tokens being evictable like prompt ones; :class:`QuestAttention` keeps
the full cache and restricts each step's attention to the pages whose keys can score highest.
"""

from __future__ import annotations

from lkv.eviction.decoding.base import (
    CacheTrace,
    DecodePolicy,
    DecodeStart,
    EvictionPolicy,
    EvictionUpkeep,
    Upkeep,
)
from lkv.eviction.decoding.capture import AttentionRows
from lkv.eviction.decoding.h2o import H2ODecode
from lkv.eviction.decoding.methods import DecodeTimePress
from lkv.eviction.decoding.quest import QuestAttention, page_bounds, page_summaries
from lkv.eviction.decoding.scissorhands import ScissorhandsDecode, ScissorhandsPress, unimportant
from lkv.eviction.decoding.sparse_attention import SPARSE_KWARG, install_sparse_attention

__all__ = [
    "SPARSE_KWARG",
    "AttentionRows",
    "CacheTrace",
    "DecodePolicy",
    "DecodeStart",
    "DecodeTimePress",
    "EvictionPolicy",
    "EvictionUpkeep",
    "H2ODecode",
    "QuestAttention",
    "ScissorhandsDecode",
    "ScissorhandsPress",
    "Upkeep",
    "install_sparse_attention",
    "page_bounds",
    "page_summaries",
    "unimportant",
]
