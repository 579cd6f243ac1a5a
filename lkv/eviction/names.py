"""The eviction options' names as plain ``Literal`` types, importable without torch.

The CLI verbs' signatures use them (``lkv generate --method``, ``--head_budget``, ``--fusion``, ``--preset``),
so their ``--help`` and option errors answer before torch loads. The modules that implement each option
import its type from here: :data:`MethodName` lists :data:`lkv.eviction.registry.METHODS` in its order
(a test holds the two equal).
"""

from __future__ import annotations

from typing import Literal

MethodName = Literal[
    "fullkv",
    "oracle",
    "lookaheadkv",
    "probe",
    "snapkv",
    "pyramidkv",
    "streamingllm",
    "h2o",
    "tova",
    "random",
    "expected_attention",
    "kvzip",
    "keydiff",
    "laq",
    "speckv",
    "h2o-decode",
    "scissorhands",
    "quest",
]
"""The registered methods' names, in the registry's order (the choices of ``--method`` / ``--methods``)."""

HeadBudget = Literal["equal", "adaptive", "threshold"]
"""How a per-head budget is spread over a layer's KV heads (:class:`lkv.eviction.selector.Selection`)."""

FusionRule = Literal["mixture", "union"]
"""How :class:`lkv.eviction.presses.fused.FusedPress` combines its parts' scores."""

PresetName = Literal["paper", "pooled", "long"]
"""The names of :data:`lkv.eviction.presses.lookahead_settings.PRESETS` (the choices of ``--preset``)."""
