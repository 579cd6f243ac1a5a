"""LookaheadKV's settings as one typed value, and its named presets.

A trained lookahead module's press ranks the prompt by the module's predicted scores, 1-D pooled
(:class:`Pooling`); optionally fused with a trained per-token probe's ranking (:class:`ProbeFusion`), as the
module reads the question and the probe each token alone; optionally with a share of the budget kept as whole
sentences around the ranking's best tokens from a budget on (:class:`SentenceShare`), so that a kept value keeps
the words that name it. :class:`LookaheadKVSettings` holds the three parts; :data:`PRESETS` names three of its
values; :func:`lkv.eviction.presses.lookaheadkv.lookahead_press` builds the press from one.

Users write a value as a preset name, or a mapping of flat keys (:data:`KEYS`, one per field, the same in
``lkv eval``'s ``press_args``, ``lkv generate``'s flags and the kvpress bridge) with an optional ``preset``
the other keys override (default :data:`DEFAULT_PRESET`)::

    long                                   {preset: long, kernel: 5}
    {kernel: 1}                            {preset: long, sentences_from_budget: 512}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, get_args

from lkv.eviction.names import FusionRule, PresetName
from lkv.eviction.presses.fused import check_rule
from lkv.eviction.presses.sentences import check_share
from lkv.eviction.selector import check_pooling

# Max-pooling the predicted scores over 7 positions before top-C keeps a value's tokens together: a value
# spelled over several tokens (a 7-digit number is 7 tokens in SmolLM2) is kept whole rather than in part.
DEFAULT_KERNEL = 7

PRESET = "preset"
"""The key of a settings mapping that names the preset its other keys override."""


@dataclasses.dataclass(frozen=True)
class Pooling:
    """1-D pooling of the module's predicted scores over the prompt.

    Attributes:
        kernel: odd window, 1 = no pooling (the paper's); key ``kernel``.
        mode: one of :data:`~lkv.eviction.selector.POOLING_MODES`; key ``pooling``.
    """

    kernel: int = DEFAULT_KERNEL
    mode: str = "max"

    def __post_init__(self) -> None:
        kernel = self.kernel
        if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd whole number ≥ 1, got {kernel!r}")
        check_pooling(kernel, self.mode)


@dataclasses.dataclass(frozen=True)
class ProbeFusion:
    """The module's ranking fused with a probe's (:class:`~lkv.eviction.presses.fused.FusedPress`), weights
    ``1 − weight`` and ``weight``.

    Attributes:
        weight: the probe's weight in ``(0, 1]``; key ``probe_weight`` (0 there: no fusion).
        rule: ``mixture`` (the pooled mixture of the module's unpooled scores and the probe's) or ``union``
            (each ranks alone, the module pooled; the top ``C`` is the union of their top tokens); key ``fusion``.
    """

    weight: float
    rule: FusionRule = "mixture"

    def __post_init__(self) -> None:
        if (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, int | float)
            or not 0 < self.weight <= 1
        ):
            raise ValueError(f"probe_weight must be a number in (0, 1] (0: no probe), got {self.weight!r}")
        try:
            check_rule(self.rule)
        except ValueError as error:
            raise ValueError(f"fusion: {error}") from None


@dataclasses.dataclass(frozen=True)
class SentenceShare:
    """A share of the budget kept as whole sentences around the ranking's best tokens
    (:class:`~lkv.eviction.presses.sentences.SentencePress`).

    Attributes:
        share: in ``(0, 1]``; key ``sentences`` (0 there: no sentences).
        beyond: the prompt's last tokens kept as single tokens, not sentences; key ``sentences_beyond``.
        scaled: the share scaled by the part of the prompt before those tokens; key ``sentences_scaled``.
        from_budget: the smallest per-head budget ``C`` the share applies at (below it the ranking keeps every
            slot: a small budget holds too few tokens to spend some on the words around a value); key
            ``sentences_from_budget``.
    """

    share: float
    beyond: int = 0
    scaled: bool = False
    from_budget: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.share, bool) or not isinstance(self.share, int | float) or not 0 < self.share <= 1:
            raise ValueError(
                f"sentences must be a share of the budget in (0, 1] (0: none), got {self.share!r}"
            )
        check_share(self.share, self.beyond, self.scaled)
        if (
            isinstance(self.from_budget, bool)
            or not isinstance(self.from_budget, int)
            or self.from_budget < 0
        ):
            raise ValueError(
                f"sentences_from_budget must be a whole number of tokens ≥ 0, got {self.from_budget!r}"
            )


# flat key → (part, field): the spelling users write; the part's first field switches the part on and off
_PARTS: dict[str, type] = {"pooling": Pooling, "probe": ProbeFusion, "sentences": SentenceShare}
_FLAT: dict[str, tuple[str, str]] = {
    "kernel": ("pooling", "kernel"),
    "pooling": ("pooling", "mode"),
    "probe_weight": ("probe", "weight"),
    "fusion": ("probe", "rule"),
    "sentences": ("sentences", "share"),
    "sentences_beyond": ("sentences", "beyond"),
    "sentences_scaled": ("sentences", "scaled"),
    "sentences_from_budget": ("sentences", "from_budget"),
}
KEYS: tuple[str, ...] = (PRESET, *_FLAT)
"""Every key a settings mapping takes."""


@dataclasses.dataclass(frozen=True)
class LookaheadKVSettings:
    """What a lookahead module's press takes beside the module, the probe and the tokenizer (module docstring).

    Attributes:
        pooling: the module's pooling.
        probe: the fusion with a probe, or None (the module alone).
        sentences: the sentence share, or None (none).
    """

    pooling: Pooling = Pooling()
    probe: ProbeFusion | None = None
    sentences: SentenceShare | None = None

    def __post_init__(self) -> None:
        for name, kind in _PARTS.items():
            part = getattr(self, name)
            if not (isinstance(part, kind) or (part is None and name != "pooling")):
                raise ValueError(f"LookaheadKVSettings.{name} must be a {kind.__name__}, got {part!r}")

    @property
    def needs_probe(self) -> bool:
        return self.probe is not None

    @property
    def needs_tokenizer(self) -> bool:
        """Sentence ends are read from the tokenizer."""
        return self.sentences is not None

    @classmethod
    def of(
        cls, value: LookaheadKVSettings | str | Mapping[str, Any] | None, default: str | None = None
    ) -> LookaheadKVSettings:
        """The settings ``value`` names: itself, a preset's name, or a mapping of :data:`KEYS` whose flat keys
        override its ``preset`` (default: ``default``, else :data:`DEFAULT_PRESET`). A key that switches a part off
        (``probe_weight: 0``, ``sentences: 0``) drops the preset's other keys of that part."""
        if isinstance(value, cls):
            return value
        value = {} if value is None else {PRESET: value} if isinstance(value, str) else value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"LookaheadKV settings: expected a preset name ({', '.join(PRESETS)}) or a mapping of "
                f"{', '.join(KEYS)}; got {value!r}"
            )
        unknown = sorted(str(key) for key in value if key not in KEYS)
        if unknown:
            raise ValueError(f"unknown LookaheadKV setting {', '.join(unknown)}; it takes {', '.join(KEYS)}")
        flat = preset(value.get(PRESET) or default or DEFAULT_PRESET).flat()
        for key, (part, _) in _FLAT.items():
            if key in value and not value[key] and _first(part) == key:
                flat = {k: v for k, v in flat.items() if _FLAT[k][0] != part}
        return cls.from_flat({**flat, **{k: v for k, v in value.items() if k != PRESET}})

    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]) -> LookaheadKVSettings:
        """Settings from flat keys (:data:`KEYS` but ``preset``): a part is on when its first key is given and
        non-zero; its other keys without it are refused (they would change nothing)."""
        parts: dict[str, Any] = {}
        for part, kind in _PARTS.items():
            given = {field: flat[key] for key, (p, field) in _FLAT.items() if p == part and key in flat}
            first = _first(part)
            if part == "pooling" or flat.get(first):
                parts[part] = kind(**{k: v for k, v in given.items() if v is not None})
            elif any(v not in (None, 0, False) for v in given.values()):
                others = ", ".join(k for k, (p, _) in _FLAT.items() if p == part and k != first and k in flat)
                raise ValueError(
                    f"{others} given without {first} > 0, which they need (alone they change nothing)"
                )
        return cls(**parts)

    def flat(self) -> dict[str, Any]:
        """Every flat key of a part that is on, with its value."""
        return {
            key: getattr(getattr(self, part), field)
            for key, (part, field) in _FLAT.items()
            if getattr(self, part) is not None
        }

    def record(self) -> dict[str, Any]:
        """The flat keys that differ from their part's defaults, plus ``kernel`` and each part's first key (what
        ``lkv eval`` records in run.json: rows scored with other settings are not resumed under these)."""
        record = {}
        for key, (part, field) in _FLAT.items():
            value = getattr(self, part)
            if value is None:
                continue
            default = {f.name: f.default for f in dataclasses.fields(_PARTS[part])}[field]
            if key in ("kernel", _first(part)) or getattr(value, field) != default:
                record[key] = getattr(value, field)
        return record


def _first(part: str) -> str:
    """The flat key of ``part``'s first field (the one that switches a part with a None default on)."""
    return next(key for key, (p, _) in _FLAT.items() if p == part)


PRESETS: dict[str, LookaheadKVSettings] = {
    # the paper's selection: the module's scores unpooled, alone
    "paper": LookaheadKVSettings(Pooling(kernel=1)),
    # the module's scores max-pooled over DEFAULT_KERNEL positions, alone
    "pooled": LookaheadKVSettings(),
    # for long prompts: fused with a probe by the union rule, half each; from C = 256 on, half of the budget
    # to whole sentences, scaled by the part of the prompt before its last 1024 tokens
    "long": LookaheadKVSettings(
        Pooling(),
        ProbeFusion(0.5, "union"),
        SentenceShare(0.5, beyond=1024, scaled=True, from_budget=256),
    ),
}
assert tuple(PRESETS) == get_args(PresetName)
DEFAULT_PRESET: PresetName = "pooled"
"""The preset of a module whose folder records none and whose user names none."""


def preset(name: str) -> LookaheadKVSettings:
    """The settings of preset ``name``."""
    if name not in PRESETS:
        raise ValueError(f"unknown LookaheadKV preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
