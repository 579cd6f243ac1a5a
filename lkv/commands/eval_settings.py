"""`lkv eval`'s settings, checked as one frozen :class:`EvalSettings` before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lkv.core.budget import Budget
from lkv.core.chat import template_kwargs
from lkv.core.context import Truncate
from lkv.eval.prompt_settings import Setting
from lkv.eval.results import adapter_method, fingerprint
from lkv.eval.shard import WHOLE, Shard
from lkv.eviction.names import HeadBudget
from lkv.eviction.presses import Press
from lkv.eviction.presses.lookahead_settings import LookaheadKVSettings
from lkv.eviction.presses.lookaheadkv import folder_defaults
from lkv.eviction.presses.restorekv import check_restore_folder
from lkv.eviction.registry import METHODS, check_press_args, make_method
from lkv.eviction.roles import ADAPTER_METHOD, PROBE_METHOD, roles_of

# run.json's record of the chat template's variables (label folders keep it in meta.json's extra)
TEMPLATE_KEY = "chat_template_kwargs"

# the method name of a module given in `--adapters` (`lookaheadkv:<name>`)
LOOKAHEAD_PREFIX = f"{ADAPTER_METHOD}:"


@dataclass(frozen=True)
class EvalSettings:
    """The options of ``lkv eval`` but its tasks, named as on the command line (see
    :func:`lkv.commands.eval.evaluate` for each), checked on construction: a bad one raises ``ValueError``
    naming its ``--flag`` before any model loads or any folder is written.

    Construction also resolves what follows from the options without a model: :attr:`methods_run` (the
    methods, lower-cased, each once, then ``lookaheadkv:<name>`` per ``adapters`` entry, then the ``variants``),
    :attr:`checked_budgets`,
    each lookahead module's settings (:attr:`module_settings`, from ``press_args`` and its folder) and probe
    (:attr:`module_probes`; :attr:`replaced_probes`: the modules whose folder's own ``probe/`` ``--probe``
    replaces), each probe method's folder (:attr:`probe_folders`: its ``press_args`` ``folder``, else
    ``--probe``), and :attr:`recorded_press_args` (``press_args`` with every module's full settings and each
    probe folder's fingerprint, as ``run.json`` records them).
    """

    methods: tuple[str, ...]
    budgets: tuple[int | float, ...]
    settings: tuple[Setting, ...]
    output: str
    model: str
    adapter: str | None
    adapters: dict[str, str] | None
    variants: tuple[str, ...]
    probe: str | None
    press_args: dict[str, dict[str, Any]] | None
    dtype: str
    attn_implementation: str
    device: str | None
    progress: bool
    title: str | None
    streamed: bool
    batch_size: int
    max_batch_tokens: int | None
    enable_thinking: bool
    head_budget: HeadBudget
    truncate: Truncate
    shard: str | None
    only_solved: str | None
    methods_run: list[str] = field(init=False)
    checked_shard: Shard = field(init=False)
    checked_budgets: list[Budget] = field(init=False)
    module_settings: dict[str, LookaheadKVSettings] = field(init=False)
    module_probes: dict[str, str | Path | None] = field(init=False)
    replaced_probes: dict[str, Path] = field(init=False)
    probe_folders: dict[str, str] = field(init=False)
    recorded_press_args: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        for name, value in (("batch_size", self.batch_size), ("max_batch_tokens", self.max_batch_tokens)):
            if value is not None and value <= 0:
                raise ValueError(f"--{name}: expected a positive number, found {value}")
        # a bad budget ends the run here (it would otherwise surface after the prefills)
        if not self.budgets:
            raise ValueError("--budgets: give at least one budget (tokens per KV head, or a ratio in (0, 1])")
        try:
            self._set("checked_budgets", [Budget.of(budget) for budget in self.budgets])
        except (TypeError, ValueError) as error:
            raise ValueError(f"--budgets: {error}") from None
        self._set("checked_shard", self._parse_shard())
        methods = list(dict.fromkeys(m.lower() for m in self.methods))
        variants = list(dict.fromkeys(v.lower() for v in self.variants))
        self._check_variants(variants, methods)
        self._check_methods(methods + variants)
        modules = [f"{LOOKAHEAD_PREFIX}{name}" for name in self.adapters or {}]
        self._set("methods_run", methods + modules + variants)
        self._check_press_args()
        self._resolve_modules()

    def _parse_shard(self) -> Shard:
        """``shard`` as a :class:`Shard` (every sample when not given)."""
        if self.shard is None:
            return WHOLE
        try:
            shard = Shard.parse(self.shard)
        except ValueError as error:
            raise ValueError(f"--shard: {error}") from None
        if self.head_budget == "threshold" and not shard.whole:
            raise ValueError(
                "--shard: --head_budget threshold calibrates each threshold on every prompt of a task; run it "
                "without --shard"
            )
        return shard

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a derived field of the frozen instance, set once here

    def _check_methods(self, methods: list[str]) -> None:
        """``methods`` (as given, then the variants) against ``adapter``, ``adapters`` and ``head_budget``."""
        if (ADAPTER_METHOD in methods) != (self.adapter is not None):
            raise ValueError(
                f"--adapter is required by the {ADAPTER_METHOD} method and used by no other method"
            )
        decode_time = [
            m for m in methods if (base := m.partition(":")[0]) in METHODS and METHODS[base].acts == "decode"
        ]
        if self.head_budget != "equal" and decode_time:
            raise ValueError(
                f"--head_budget {self.head_budget} spreads a prefill-time method's budget over the heads; the "
                f"decode-time methods {decode_time} keep equal budgets while decoding: leave them out of --methods"
            )
        if self.adapters and self.adapter is None:
            raise ValueError("--adapters adds lookahead modules beside --adapter's; give --adapter too")
        bad_names = [n for n in self.adapters or {} if not n or not all(c.isalnum() or c in "_-." for c in n)]
        if bad_names:
            raise ValueError(
                f"--adapters: names must be non-empty letters, digits, '_', '-' or '.', got {bad_names}"
            )

    def _check_variants(self, variants: list[str], methods: list[str]) -> None:
        """Each of ``variants`` is ``<method>:<name>`` of a registered method that takes settings (not a lookahead
        module: ``adapters`` adds those; a probe's is its folder), named apart from ``methods``."""
        for variant in variants:
            method, _, name = variant.partition(":")
            if method not in METHODS or not name or not all(c.isalnum() or c in "_-." for c in name):
                raise ValueError(
                    f"--variants: expected <method>:<name> (a method of `lkv eval --help`, a name of letters, "
                    f"digits, '_', '-' or '.'), found {variant!r}"
                )
            roles = roles_of(method)
            if roles.role != "method" or roles.requires == "adapter":
                raise ValueError(
                    f"--variants: {variant!r}: {method} takes no settings of its own here"
                    + (
                        " (more lookahead modules come from --adapters)"
                        if roles.requires == "adapter"
                        else ""
                    )
                )
            if variant in methods:
                raise ValueError(f"--variants: {variant!r} is already one of --methods")

    def _check_press_args(self) -> None:
        """Every ``press_args`` entry names an evaluated method that takes settings, with keys it knows."""
        press_args = self.press_args or {}
        # the reference keeps everything, the upper bound is scored from its answer
        takes_settings = {m for m in self.methods_run if roles_of(m).role == "method"}
        unused = sorted(set(press_args) - takes_settings)
        if unused:
            raise ValueError(
                f"press_args given for {unused}: only evaluated methods other than fullkv and oracle (scored from "
                "the FullKV answer) take settings"
            )
        for method, own in press_args.items():
            check_press_args(method, own)
        for method in self.methods_run:
            if roles_of(method).requires == "restore":
                own = press_args.get(method, {})
                check_restore_folder(method, own)
                if own.get("scores") == ADAPTER_METHOD and ADAPTER_METHOD not in self.methods_run:
                    raise ValueError(
                        f"press_args for {method}: scores: {ADAPTER_METHOD} selects with the module of --adapter: "
                        f"evaluate {ADAPTER_METHOD} too (--adapter)"
                    )

    @property
    def folders(self) -> dict[str, str | None]:
        """Lookahead method name → its module's folder or checkpoint."""
        named = {f"{LOOKAHEAD_PREFIX}{n}": f for n, f in (self.adapters or {}).items()}
        return {ADAPTER_METHOD: self.adapter, **named}

    def _resolve_modules(self) -> None:
        """Each lookahead module's settings and probe, from ``press_args`` and its folder; then whether
        ``probe`` is given exactly when a method needs it."""
        press_args = dict(self.press_args or {})
        settings: dict[str, LookaheadKVSettings] = {}
        probes: dict[str, str | Path | None] = {}
        replaced: dict[str, Path] = {}
        for method in (m for m in self.methods_run if adapter_method(m)):
            defaults = folder_defaults(self.folders[method])
            try:
                settings[method] = defaults.settings(press_args.get(method))
            except ValueError as error:
                raise ValueError(f"press_args for {method}: {error}") from None
            probes[method] = defaults.probe_for(
                settings[method], self.probe, f"{method} ({self.folders[method]})"
            )
            own = defaults.probe
            if (
                probes[method] is not None
                and own is not None
                and Path(probes[method]).resolve() != own.resolve()
            ):
                replaced[method] = own
            # run.json records every module's settings, the default's too: rows scored with others are not resumed
            press_args[method] = settings[method].record()
        folders = self._probe_folders(press_args)
        fused = [m for m, s in settings.items() if s.needs_probe]
        reads_run_probe = any(folder == self.probe for folder in folders.values()) or bool(fused)
        if self.probe is not None and not reads_run_probe:
            raise ValueError(
                f"--probe is required by the {PROBE_METHOD} method (unless its press_args name a folder), used by "
                "lookahead modules whose settings fuse a probe (probe_weight > 0; default: their folder's probe/), "
                "and by nothing else"
            )
        for method in set(folders) & set(press_args):  # --probe's fingerprint is run.json's "probe"
            press_args[method] = {"folder": folders[method], "fingerprint": fingerprint(folders[method])}
        self._set("probe_folders", folders)
        self._set("module_settings", settings)
        self._set("module_probes", probes)
        self._set("replaced_probes", replaced)
        self._set("recorded_press_args", press_args)

    def _probe_folders(self, press_args: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Each probe method's folder: its ``press_args`` ``folder``, else (``probe`` itself) ``--probe``;
        a ``press_args`` folder is checked to exist before any model loads."""
        folders = {}
        for method in (m for m in self.methods_run if roles_of(m).requires == "probe"):
            folder = press_args.get(method, {}).get("folder")
            if folder is not None and not Path(folder).exists():
                raise ValueError(f"press_args for {method}: folder: no probe at {folder}")
            if folder is None and method != PROBE_METHOD:
                raise ValueError(
                    f"press_args for {method}: give its probe folder, e.g. {{{method}: {{folder: PATH}}}}"
                )
            folder = folder if folder is not None else self.probe
            if folder is None:
                raise ValueError(
                    f"--probe is required by the {PROBE_METHOD} method unless its press_args name a folder"
                )
            folders[method] = str(folder)
        return folders

    def training_free_presses(self) -> dict[str, Press]:
        """FullKV's and the training-free methods' presses: they need no model, so a bad setting (a negative
        SnapKV window) is refused before ``run.json`` records it and the corrected command runs in the folder."""
        presses: dict[str, Press] = {}
        for method in self.methods_run:
            if not roles_of(method).requires and roles_of(method).role != "upper bound":
                try:
                    presses[method] = make_method(method, **self.recorded_press_args.get(method, {}))
                except (TypeError, ValueError) as error:
                    raise ValueError(f"press_args for {method}: {error}") from None
        return presses

    def run_info(self) -> dict[str, Any]:
        """What ``run.json`` records of this run (a rerun into the folder with other values is refused)."""
        adapters = self.adapters or {}
        return {
            "model": self.model,
            "adapter": None if self.adapter is None else fingerprint(self.adapter),
            **({"adapters": {n: fingerprint(f) for n, f in adapters.items()}} if adapters else {}),
            "probe": None if self.probe is None else fingerprint(self.probe),
            "press_args": self.recorded_press_args,
            "dtype": self.dtype,
            TEMPLATE_KEY: template_kwargs(self.enable_thinking),
            "head_budget": self.head_budget,
            "truncate": self.truncate,
        }
