"""Eviction methods behind one interface (:class:`~lkv.presses.base.Press`) and the shared selector.

``make_press("snapkv", window=16)`` builds a method by name; :data:`PRESSES` lists them.
"""

from __future__ import annotations

from lkv.presses.base import Press, PressContext, pool_scores
from lkv.presses.full import FullKVPress
from lkv.presses.h2o import H2OPress
from lkv.presses.laq import LAQPress
from lkv.presses.lookaheadkv import LookaheadKVPress
from lkv.presses.oracle import OraclePress
from lkv.presses.pyramidkv import PyramidKVPress
from lkv.presses.random_press import RandomPress
from lkv.presses.snapkv import SnapKVPress
from lkv.presses.speckv import SpecKVPress
from lkv.presses.streaming import StreamingLLMPress
from lkv.presses.tova import TOVAPress

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
