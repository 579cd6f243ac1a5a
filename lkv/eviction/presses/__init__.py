"""Eviction methods behind one interface (:class:`~lkv.eviction.presses.base.Press`) and the shared selector.

``make_press("snapkv", window=16)`` builds a method by name; :data:`PRESSES` lists them.
"""

from __future__ import annotations

from lkv.eviction.presses.base import Press, PressContext, pool_scores
from lkv.eviction.presses.full import FullKVPress
from lkv.eviction.presses.h2o import H2OPress
from lkv.eviction.presses.laq import LAQPress
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.presses.oracle import OraclePress
from lkv.eviction.presses.pyramidkv import PyramidKVPress
from lkv.eviction.presses.random_press import RandomPress
from lkv.eviction.presses.snapkv import SnapKVPress
from lkv.eviction.presses.speckv import SpecKVPress
from lkv.eviction.presses.streaming import StreamingLLMPress
from lkv.eviction.presses.tova import TOVAPress

PRESSES: dict[str, type[Press]] = {
    press.name: press
    for press in (
        FullKVPress,
        StreamingLLMPress,
        SnapKVPress,
        PyramidKVPress,
        H2OPress,
        TOVAPress,
        RandomPress,
        LAQPress,
        SpecKVPress,
        OraclePress,
        LookaheadKVPress,
    )
}


def make_press(name: str, **kwargs) -> Press:
    """Instantiate the method registered as ``name`` (see :data:`PRESSES`) with its keyword arguments."""
    try:
        cls = PRESSES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown eviction method {name!r}; choose one of {', '.join(PRESSES)}") from None
    return cls(**kwargs)


__all__ = [
    "PRESSES",
    "FullKVPress",
    "H2OPress",
    "LAQPress",
    "LookaheadKVPress",
    "OraclePress",
    "Press",
    "PressContext",
    "PyramidKVPress",
    "RandomPress",
    "SnapKVPress",
    "SpecKVPress",
    "StreamingLLMPress",
    "TOVAPress",
    "make_press",
    "pool_scores",
]
