"""Eviction methods behind one interface (:class:`~lkv.eviction.presses.base.Press`): each scores the prompt;
the shared selector (:mod:`lkv.eviction.selector`) turns the scores into kept positions.

One file per method; :mod:`lkv.eviction.registry` names them (``make_method("snapkv", window=16)``).
"""

from __future__ import annotations

from lkv.eviction.presses.base import (
    LayerScorer,
    Press,
    PressContext,
    StreamContext,
)
from lkv.eviction.presses.expected_attention import ExpectedAttentionPress
from lkv.eviction.presses.full import FullKVPress
from lkv.eviction.presses.fused import FusedPress
from lkv.eviction.presses.h2o import H2OPress
from lkv.eviction.presses.keydiff import KeyDiffPress
from lkv.eviction.presses.kvzip import KVzipPress
from lkv.eviction.presses.laq import LAQPress
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.presses.oracle import OraclePress
from lkv.eviction.presses.probe import ProbePress
from lkv.eviction.presses.pyramidkv import PyramidKVPress
from lkv.eviction.presses.random_press import RandomPress
from lkv.eviction.presses.snapkv import SnapKVPress
from lkv.eviction.presses.speckv import SpecKVPress
from lkv.eviction.presses.streaming import StreamingLLMPress
from lkv.eviction.presses.tova import TOVAPress

__all__ = [
    "ExpectedAttentionPress",
    "FullKVPress",
    "FusedPress",
    "H2OPress",
    "KVzipPress",
    "KeyDiffPress",
    "LAQPress",
    "LayerScorer",
    "LookaheadKVPress",
    "OraclePress",
    "Press",
    "PressContext",
    "ProbePress",
    "PyramidKVPress",
    "RandomPress",
    "SnapKVPress",
    "SpecKVPress",
    "StreamContext",
    "StreamingLLMPress",
    "TOVAPress",
]
