"""The eviction options' names as plain ``Literal`` types, importable without torch.

The CLI verbs' signatures use them (``lkv generate --method``, ``--head_budget``, ``--fusion``, ``--preset``;
``lkv eval --methods`` and its default), so their ``--help`` and option errors answer before torch loads. The
modules that implement each option import its type from here: :data:`MethodName` lists
:data:`lkv.eviction.registry.METHODS` in its order, :data:`DEFAULT_METHODS` the registry's default methods
(a test holds each equal to the registry).
"""

from __future__ import annotations

from typing import Literal, get_args

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
    "restorekv",
    "keydiff",
    "laq",
    "speckv",
    "h2o-decode",
    "scissorhands",
    "quest",
]
"""The registered methods' names, in the registry's order (the choices of ``--method`` / ``--methods``)."""

DEFAULT_METHODS: tuple[MethodName, ...] = tuple(
    name for name in get_args(MethodName) if name not in ("probe", "kvzip", "restorekv", "laq", "speckv")
)
"""The methods ``lkv eval`` runs by default (the default of ``--methods``): every registered method but the five
the registry leaves out of :data:`lkv.eviction.registry.DEFAULT_METHODS`, in its order (a test holds the two
equal)."""

HeadBudget = Literal["equal", "adaptive", "threshold"]
"""How a per-head budget is spread over a layer's KV heads (:class:`lkv.eviction.selector.Selection`)."""

FusionRule = Literal["mixture", "union"]
"""How :class:`lkv.eviction.presses.fused.FusedPress` combines its parts' scores."""

PresetName = Literal["paper", "pooled", "long"]
"""The names of :data:`lkv.eviction.presses.lookahead_settings.PRESETS` (the choices of ``--preset``)."""
