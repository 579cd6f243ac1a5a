"""`lkv generate`'s settings, checked as one frozen :class:`GenerateSettings` before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lkv.core.budget import Budget
from lkv.core.context import Truncate
from lkv.core.files import read_text
from lkv.eviction.names import FusionRule, HeadBudget, MethodName, PresetName
from lkv.eviction.presses.lookahead_settings import LookaheadKVSettings
from lkv.eviction.presses.lookaheadkv import folder_defaults
from lkv.eviction.presses.restorekv import check_restore_folder
from lkv.eviction.registry import check_press_args
from lkv.eviction.roles import ADAPTER_METHOD, PROBE_METHOD, roles_of
from lkv.eviction.selector import Selection

#: the flags that set a lookahead module's settings one key each (the rest go in ``--press_args``)
LOOKAHEAD_FLAGS = (
    "preset",
    "kernel",
    "pooling",
    "probe_weight",
    "fusion",
    "sentences",
    "sentences_beyond",
    "sentences_scaled",
    "sentences_from_budget",
)


@dataclass(frozen=True)
class GenerateSettings:
    """The options of ``lkv generate``, named as on the command line (see :func:`lkv.commands.generate.generate`
    for each), checked on construction: a bad one raises ``ValueError`` (a missing ``--prompt_file``:
    ``FileNotFoundError``) naming its ``--flag`` before any model loads.

    Construction also resolves what follows from the options without a model: :attr:`text` (the prompt, read
    from ``prompt_file`` if given), :attr:`checked_budget`, :attr:`selection`, the lookahead module's
    :attr:`lookahead` settings (from its flags, ``press_args`` and its folder; None for another method) and
    :attr:`fused_probe` (the probe those settings fuse: ``--probe`` or the folder's own).
    """

    prompt: str | None
    prompt_file: str | None
    model: str | None
    method: MethodName
    budget: int | float
    question: str | None
    adapter: str | None
    probe: str | None
    preset: PresetName | None
    kernel: int | None
    pooling: str | None
    probe_weight: float | None
    fusion: FusionRule | None
    sentences: float | None
    sentences_beyond: int | None
    sentences_scaled: bool | None
    sentences_from_budget: int | None
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str] | None
    sink: int
    recent: int
    selection_kernel: int
    selection_pooling: str
    press_args: dict | None
    dtype: str
    attn_implementation: str
    device: str | None
    streamed: bool
    enable_thinking: bool
    head_budget: HeadBudget
    threshold: float | None
    truncate: Truncate
    text: str = field(init=False)
    checked_budget: Budget = field(init=False)
    selection: Selection = field(init=False)
    lookahead: LookaheadKVSettings | None = field(init=False)
    fused_probe: str | Path | None = field(init=False)

    def __post_init__(self) -> None:
        self._set("text", self._read_prompt())
        try:
            self._set("checked_budget", Budget.of(self.budget))
        except (TypeError, ValueError) as error:
            raise ValueError(f"--budget: {error}") from None
        if self.threshold is not None and self.head_budget != "threshold":
            raise ValueError(
                f"--threshold applies with --head_budget threshold, got --head_budget {self.head_budget}"
            )
        selection = Selection(
            self.sink,
            self.recent,
            self.selection_kernel,
            self.selection_pooling,
            self.head_budget,
            threshold=self.threshold,
        )
        self._set("selection", selection)
        requires = roles_of(self.method).requires
        if (self.adapter is not None) != (requires == "adapter"):
            raise ValueError(
                f"--adapter is required by --method {ADAPTER_METHOD} and used by no other method"
            )
        typed = self.lookahead_flags
        if typed and requires != "adapter":
            raise ValueError(
                f"{self._flags}: settings of --method {ADAPTER_METHOD}; got --method {self.method} (a method's own "
                "settings go in --press_args, the selector's pooling in --selection_kernel)"
            )
        check_press_args(self.method, self.press_args or {})
        both = sorted(set(self.press_args or {}) & set(typed))
        if both:
            raise ValueError(f"{', '.join(both)}: given both as a flag and in --press_args; give each once")
        self._set("lookahead", None)
        self._set("fused_probe", None)
        if requires == "adapter":
            self._resolve_lookahead()
        elif (self.probe is not None) != (requires == "probe"):
            raise ValueError(
                f"--probe is required by --method {PROBE_METHOD} and used by no other method here"
            )
        elif requires == "probe" and self.press_args:
            raise ValueError(
                f"--press_args: --method {PROBE_METHOD} takes none (its settings come from its folder)"
            )
        elif requires == "restore":
            check_restore_folder(self.method, self.press_args or {})
            if (self.press_args or {}).get("scores", "kvzip") != "kvzip":
                raise ValueError(
                    "--press_args: scores: lkv generate evicts with KVzip under restorekv (lkv eval takes "
                    "scores: lookaheadkv beside --adapter)"
                )

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a derived field of the frozen instance, set once here

    def _read_prompt(self) -> str:
        """The prompt: ``prompt`` or the text of ``prompt_file`` (exactly one given), not blank."""
        if (self.prompt is None) == (self.prompt_file is None):
            raise ValueError("give exactly one of --prompt and --prompt_file")
        prompt = self.prompt
        if self.prompt_file is not None:
            path = Path(self.prompt_file)
            if not path.is_file():
                raise FileNotFoundError(f"--prompt_file {path}: no such file")
            prompt = read_text(path, "--prompt_file")
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        return prompt

    @property
    def lookahead_flags(self) -> dict[str, Any]:
        """The lookahead module's settings given as flags (:data:`LOOKAHEAD_FLAGS`), by key."""
        return {key: getattr(self, key) for key in LOOKAHEAD_FLAGS if getattr(self, key) is not None}

    @property
    def _flags(self) -> str:
        return ", ".join(f"--{key}" for key in self.lookahead_flags)

    def _resolve_lookahead(self) -> None:
        """The module's settings (its folder's defaults, then ``press_args``, then the flags) and their probe."""
        defaults = folder_defaults(self.adapter)
        try:
            settings = defaults.settings({**(self.press_args or {}), **self.lookahead_flags})
        except ValueError as error:
            raise ValueError(f"{self._flags or '--press_args'}: {error}") from None
        if self.probe is not None and not settings.needs_probe:
            raise ValueError(
                f"--probe is fused with --method {ADAPTER_METHOD} only when its settings fuse a probe "
                "(--probe_weight > 0, or --preset long)"
            )
        self._set("lookahead", settings)
        self._set("fused_probe", defaults.probe_for(settings, self.probe, f"--adapter {self.adapter}"))
