"""Every eviction method under one name, in one registry: prefill presses and decode-time methods alike.

``make_method("snapkv", window=16)`` builds a method by name. :data:`METHODS` is the single source of the
method names that the CLI accepts, of the default method list of ``lkv eval`` (:data:`DEFAULT_METHODS`)
and of the method table in docs/evaluation.md (:func:`method_table`, checked by a test). What evaluation and
the commands must know about a method beyond its press (the reference, the upper bound, what it needs, whether
it evicts, whether it ranks) is data beside it, in :mod:`lkv.eviction.roles` (light to import).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from lkv.eviction.decoding.methods import h2o_decode, quest, scissorhands
from lkv.eviction.presses import (
    ExpectedAttentionPress,
    FullKVPress,
    H2OPress,
    KeyDiffPress,
    KVzipPress,
    LAQPress,
    OraclePress,
    Press,
    ProbePress,
    PyramidKVPress,
    RandomPress,
    SnapKVPress,
    SpecKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from lkv.eviction.presses.lookahead_settings import KEYS as LOOKAHEAD_KEYS
from lkv.eviction.presses.lookaheadkv import lookahead_press
from lkv.eviction.presses.restorekv import RESTORE_SETTINGS, RestoreKVPress
from lkv.eviction.roles import ROLES, Roles, registered_name


@dataclass(frozen=True)
class Method:
    """One registered eviction method.

    Attributes:
        name: the name used by the CLI, configs, result rows and reports.
        build: ``build(**settings) -> Press``.
        acts: ``prefill`` (scores the prompt once, then the cache is fixed) or ``decode`` (keeps acting
            while tokens are generated).
        summary: one line for the docs' method table.
        default: part of ``lkv eval``'s default method list.
        needs: what else the method needs, if anything (shown in the table).
    """

    name: str
    build: Callable[..., Press]
    acts: Literal["prefill", "decode"]
    summary: str
    default: bool = True
    needs: str = ""

    @property
    def roles(self) -> Roles:
        """Its part in an evaluation (:data:`lkv.eviction.roles.ROLES`)."""
        return ROLES.get(self.name, Roles())


_REGISTERED = (
    Method(
        "fullkv",
        FullKVPress,
        "prefill",
        "no eviction: the reference every method is compared with",
    ),
    Method(
        "oracle",
        OraclePress,
        "prefill",
        "s_GT of the model's own full-cache answer (an upper bound, not a method)",
        needs="the full-cache answer",
    ),
    Method(
        "lookaheadkv",
        lookahead_press,
        "prefill",
        "the trained lookahead module predicts the future response's attention; presets `paper`, `pooled` (the default), `long`",
        needs="an adapter (`--adapter`)",
    ),
    Method(
        "probe",
        ProbePress,
        "prefill",
        "a per-token probe (KVzap-style) on each layer's hidden states, trained on the same labels",
        default=False,
        needs="a probe (`--probe`, or its own folder: `press_args: {probe: {folder: ...}}`)",
    ),
    Method(
        "snapkv",
        SnapKVPress,
        "prefill",
        "attention of the last `window` prompt queries, 1-D pooled; window kept",
    ),
    Method(
        "pyramidkv",
        PyramidKVPress,
        "prefill",
        "SnapKV scores with budgets shrinking with depth, same total",
    ),
    Method("streamingllm", StreamingLLMPress, "prefill", "the first `sink` tokens plus the most recent ones"),
    Method("h2o", H2OPress, "prefill", "attention accumulated over every prompt query, plus a recent window"),
    Method(
        "tova",
        TOVAPress,
        "prefill",
        "attention of the last prompt query, averaged over all heads: one ranking per layer",
    ),
    Method("random", RandomPress, "prefill", "random scores: the floor"),
    Method(
        "expected_attention",
        ExpectedAttentionPress,
        "prefill",
        "attention future queries are expected to pay, from the prompt's query statistics (kvpress's default)",
    ),
    Method(
        "kvzip",
        KVzipPress,
        "prefill",
        "max attention of a pass that repeats the context (question-agnostic; a second pass over the prompt)",
        default=False,
    ),
    Method(
        "restorekv",
        RestoreKVPress.from_folder,
        "prefill",
        "KVzip evicts; `n` trained restore tokens' K/V, from one LoRA pass over the full cache, fill `n` of each head's `C` slots",
        default=False,
        needs="a restore folder (`press_args: {restorekv: {folder: ...}}`)",
    ),
    Method("keydiff", KeyDiffPress, "prefill", "keys least similar to the layer's mean key; no attention"),
    Method(
        "laq",
        LAQPress,
        "prefill",
        "pseudo response drafted from a SnapKV-compressed cache scores the full cache",
        default=False,
    ),
    Method(
        "speckv",
        SpecKVPress,
        "prefill",
        "a draft model's answer scores the target's cache",
        default=False,
        needs="a draft model",
    ),
    Method(
        "h2o-decode",
        h2o_decode,
        "decode",
        "H2O as published: the cache stays within the budget while decoding",
    ),
    Method(
        "scissorhands",
        scissorhands,
        "decode",
        "Scissorhands: unimportant-token counts, evicted while decoding",
    ),
    Method(
        "quest",
        quest,
        "decode",
        "Quest page selection per step; keeps the full cache (no memory saved)",
    ),
)
METHODS: dict[str, Method] = {method.name: method for method in _REGISTERED}
DEFAULT_METHODS: tuple[str, ...] = tuple(method.name for method in _REGISTERED if method.default)


PROBE_SETTINGS = ("folder",)
"""What ``press_args`` may give a probe method: its folder (``probe:<name>`` variants each their own; ``probe``
defaults to ``--probe``)."""


def _registered(name: str) -> Method | None:
    """The method registered as ``name`` or as the ``<name>`` of ``<name>:<entry>`` (case-insensitive)."""
    registered = registered_name(name, METHODS)
    return None if registered is None else METHODS[registered]


def make_method(name: str, **settings) -> Press:
    """The eviction method registered as ``name`` (case-insensitive; ``<name>:<entry>`` is the same method),
    built with its own ``settings``."""
    method = _registered(name)
    if method is None:
        raise ValueError(f"unknown eviction method {name!r}; choose one of {', '.join(METHODS)}")
    return method.build(**settings)


def press_arg_names(name: str) -> tuple[str, ...]:
    """The keys ``press_args`` may give the method evaluated as ``name`` (``<name>:<module>`` too): a trained
    lookahead module's settings (:data:`~lkv.eviction.presses.lookahead_settings.KEYS`: its press's other
    arguments are the module, the probe and the tokenizer), a RestoreKV module's
    (:data:`~lkv.eviction.presses.restorekv.RESTORE_SETTINGS`: its folder and KVzip's chunks), a probe's
    (:data:`PROBE_SETTINGS`: its folder), else the keyword arguments of the method's build."""
    method = _registered(name)
    if method is None:
        raise ValueError(f"unknown eviction method {name!r}; choose one of {', '.join(METHODS)}")
    if method.roles.requires == "adapter":
        return LOOKAHEAD_KEYS
    if method.roles.requires == "restore":
        return RESTORE_SETTINGS
    if method.roles.requires == "probe":
        return PROBE_SETTINGS
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in inspect.signature(method.build).parameters.values() if p.kind in kinds)


def check_press_args(name: str, args: Mapping[str, Any]) -> None:
    """Raise one clear error unless ``args`` are settings the method evaluated as ``name`` takes
    (:func:`press_arg_names`), before any model loads; their values are checked when the press is built (a
    lookahead module's against its folder's preset: :meth:`~lkv.eviction.presses.lookahead_settings.LookaheadKVSettings.of`)."""
    if not isinstance(args, Mapping):
        raise ValueError(f"press_args for {name}: expected a mapping of settings, got {args!r}")
    names = press_arg_names(name)
    unknown = sorted(str(key) for key in args if key not in names)
    if unknown:
        takes = ", ".join(names) if names else "no settings"
        raise ValueError(f"press_args for {name}: unknown key {', '.join(unknown)}; {name} takes {takes}")


def method_table() -> str:
    """The Markdown table of every registered method (docs/evaluation.md holds a copy, checked by a test)."""
    rows = ["| method | acts | what it keeps | needs | in the default list |", "|---|---|---|---|---|"]
    for m in _REGISTERED:
        rows.append(
            f"| `{m.name}` | {m.acts} | {m.summary} | {m.needs or '–'} | {'yes' if m.default else 'no'} |"
        )
    return "\n".join(rows)
