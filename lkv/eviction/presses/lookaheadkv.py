"""LookaheadKV: the trained lookahead module predicts the importance the future response will assign.

:func:`lookahead_press` builds a module's press from its settings (:mod:`~lkv.eviction.presses.lookahead_settings`:
a preset name or a typed value); :func:`load_lookahead` loads an ``lkv export`` folder: its base model,
tokenizer and that press, with the folder's own defaults (:func:`folder_defaults`).

An exported folder is ``LookaheadAdapter.save``'s layout, optionally with ``probe/`` (an ``ImportanceProbe.save``
folder for the same base model) and ``"preset": NAME`` in ``lookahead.json``'s ``extra``: the preset the module
was validated with, used when the user names none, and the probe, used when the settings fuse one and the user
gives none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.eviction.presses.base import (
    LayerScorer,
    Press,
    PressContext,
    StreamContext,
)
from lkv.eviction.presses.fused import FusedPress
from lkv.eviction.presses.lookahead_settings import DEFAULT_KERNEL, DEFAULT_PRESET, LookaheadKVSettings
from lkv.eviction.presses.probe import ProbePress
from lkv.eviction.presses.sentences import SentencePress, sentence_ends
from lkv.eviction.selector import check_pooling, pool_scores
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.lookahead import CONFIG_FILE, LookaheadAdapter, exported_base_model, trained_setting
from lkv.model.probe import PROBE_SUBFOLDER
from lkv.model.tokens import DEFAULT_ADAPTER

Settings = LookaheadKVSettings | str | Mapping[str, Any]
"""A lookahead module's settings as users give them (:meth:`LookaheadKVSettings.of`)."""

PRESET_KEY = "preset"
"""The key of ``lookahead.json``'s ``extra`` that may name the preset the module was validated with."""


class LookaheadKVPress(Press):
    """Scores = :meth:`LookaheadAdapter.predict` on the prompt cache (no window: paper Table 7), optionally
    1-D pooled as SnapKV pools its window's votes.

    The adapter's LoRA is injected into the base model in place and is off outside ``predict``, so the
    prompt's prefill and the decoding run the unchanged base model.

    Args:
        adapter: the trained lookahead module.
        kernel, pooling: 1-D pooling of the predicted scores over the prompt (odd kernel, 1 = none, the paper's;
            default max over :data:`~lkv.eviction.presses.lookahead_settings.DEFAULT_KERNEL`; see
            :data:`~lkv.eviction.selector.POOLING_MODES`): a kept token keeps its neighbours' chance, so a value
            spelled over several tokens is kept whole rather than in part.
    """

    name = "lookaheadkv"
    streamable = True

    def __init__(self, adapter: LookaheadAdapter, kernel: int = DEFAULT_KERNEL, pooling: str = "max") -> None:
        check_pooling(kernel, pooling)
        self.adapter = adapter
        self.kernel = kernel
        self.pooling = pooling

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        model: PreTrainedModel,
        adapter_name: str = DEFAULT_ADAPTER,
        kernel: int = DEFAULT_KERNEL,
        pooling: str = "max",
    ) -> LookaheadKVPress:
        """Load an ``lkv export`` folder on top of ``model`` (which it modifies in place, adapter off); ``model``
        may be another press's ``adapter.model``, to score one prefill with several modules."""
        return cls(LookaheadAdapter.load(folder, model, adapter_name=adapter_name), kernel, pooling)

    @property
    def base_model(self) -> PreTrainedModel:
        """The base model the adapter is injected into (the model to prefill and decode with)."""
        return self.adapter.base_model

    def score(self, ctx: PressContext) -> torch.Tensor:
        self._check_model(ctx.model)
        with torch.no_grad():
            return pool_scores(self.adapter.predict(ctx.cache, ctx.prompt_len), self.kernel, self.pooling)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        """The lookahead tokens' residual stream beside the prefill (:meth:`LookaheadAdapter.stream`)."""
        self._check_model(ctx.model)
        stream = self.adapter.stream(ctx.cache, ctx.prompt_len)
        return lambda layer: pool_scores(stream.layer_scores(layer), self.kernel, self.pooling)

    def _check_model(self, model: PreTrainedModel) -> None:
        if model is not self.base_model and model is not self.adapter.model:
            raise ValueError(
                "the LookaheadKV adapter was loaded on another model than the one being compressed"
            )


def lookahead_press(
    module: LookaheadAdapter,
    probe: ProbePress | None = None,
    settings: Settings = DEFAULT_PRESET,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Press:
    """A lookahead module's press for ``settings`` (:class:`LookaheadKVSettings`, a preset name or a mapping):
    LookaheadKV pooled; with ``settings.probe``, fused with ``probe`` (weights ``1 − w`` and ``w``): ``mixture``
    pools the mixture of the module's unpooled scores and the probe's, ``union`` ranks the module's pooled scores
    and the probe's as each ranks alone; with ``settings.sentences``, a share of the budget to whole sentences
    (:class:`~lkv.eviction.presses.sentences.SentencePress`, sentence ends read from ``tokenizer``).
    ``probe`` is used only when the settings fuse one."""
    settings = LookaheadKVSettings.of(settings)
    if settings.needs_probe and probe is None:
        raise ValueError(
            f"probe_weight {settings.probe.weight}: a lookahead module fused with a probe needs a probe"
        )
    check_tokenizer(settings, tokenizer)
    kernel, pooling = settings.pooling.kernel, settings.pooling.mode
    if settings.probe is None:
        press: Press = LookaheadKVPress(module, kernel, pooling)
    elif settings.probe.rule == "union":
        weights = [1 - settings.probe.weight, settings.probe.weight]
        press = FusedPress([LookaheadKVPress(module, kernel, pooling), probe], weights, rule="union")
    else:
        weights = [1 - settings.probe.weight, settings.probe.weight]
        press = FusedPress([LookaheadKVPress(module, kernel=1), probe], weights, kernel, pooling, "mixture")
    share = settings.sentences
    if share is None:
        return press
    return SentencePress(
        press, sentence_ends(tokenizer), share.share, share.beyond, share.scaled, share.from_budget
    )


def check_tokenizer(settings: LookaheadKVSettings, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """Raise a clear error if ``settings`` keep sentences and no tokenizer (their sentence ends) is given."""
    if settings.needs_tokenizer and tokenizer is None:
        raise ValueError("sentences > 0 finds sentence ends with the tokenizer: give the tokenizer")


@dataclass(frozen=True)
class FolderDefaults:
    """What an exported adapter folder brings beside the module (module docstring).

    Attributes:
        preset: the preset it records, else :data:`~lkv.eviction.presses.lookahead_settings.DEFAULT_PRESET`.
        probe: its ``probe/`` folder, if it has one.
        setting: the prompt setting the module was trained for (:func:`~lkv.model.lookahead.trained_setting`).
    """

    preset: str = DEFAULT_PRESET
    probe: Path | None = None
    setting: str = "aware"

    def settings(self, value: Settings | None) -> LookaheadKVSettings:
        """``value`` with this folder's preset as the default (a mapping without ``preset`` overrides it)."""
        return LookaheadKVSettings.of(value, default=self.preset)

    def probe_for(
        self, settings: LookaheadKVSettings, probe: str | Path | None, where: str
    ) -> str | Path | None:
        """The probe ``settings`` fuse: ``probe`` (the user's) if given, else the folder's; None when they fuse
        none. Raises a clear error, before any model loads, when they fuse one and neither exists."""
        if not settings.needs_probe:
            return None
        if probe is None and self.probe is None:
            raise ValueError(
                f"{where}: the settings fuse the module with a probe (probe_weight {settings.probe.weight}) and "
                f"there is none: give --probe, or export the adapter folder with a {PROBE_SUBFOLDER}/ sub-folder"
            )
        return self.probe if probe is None else probe


def folder_defaults(adapter: str | Path) -> FolderDefaults:
    """The defaults an adapter folder records (:class:`FolderDefaults`); a checkpoint (``.ckpt``) records none."""
    folder = Path(adapter)
    path = folder / CONFIG_FILE
    if not path.is_file():
        return FolderDefaults()
    try:
        extra = json.loads(path.read_text()).get("extra", {})
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    name = extra.get(PRESET_KEY, DEFAULT_PRESET)
    try:
        LookaheadKVSettings.of(name)
    except ValueError as error:
        raise ValueError(f"{path}: extra.{PRESET_KEY}: {error}") from None
    probe = folder / PROBE_SUBFOLDER
    return FolderDefaults(name, probe if probe.is_dir() else None, trained_setting(extra, str(path)))


def load_lookahead(
    adapter: str | Path,
    model: str | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
    settings: Settings | None = None,
    probe: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Press]:
    """``(base model, tokenizer, press)`` for a trained lookahead module in an ``lkv export`` folder.

    Args:
        adapter: an ``lkv export`` folder (:func:`lkv.train.export.resolve_adapter` turns an ``lkv fit``
            checkpoint into one).
        model: the base model; default: the one the folder was exported from, else ``smollm2-135m``.
        settings: the press's settings (:meth:`LookaheadKVSettings.of`); default: the folder's preset.
        probe: an ``lkv export`` probe folder to fuse when the settings fuse one; default: the folder's
            ``probe/``.
    """
    defaults = folder_defaults(adapter)
    checked = defaults.settings(settings)
    probe = defaults.probe_for(checked, probe, f"adapter {str(adapter)!r}")
    net, tokenizer, module = load_module(adapter, model, dtype, attn_implementation, device)
    probe_press = None if probe is None else ProbePress.from_folder(probe, net)
    return net, tokenizer, lookahead_press(module, probe_press, checked, tokenizer)


def load_module(
    adapter: str | Path,
    model: str | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, LookaheadAdapter]:
    """``(base model, tokenizer, module)`` of an ``lkv export`` folder (arguments as :func:`load_lookahead`)."""
    path = Path(adapter)
    if not path.is_dir():
        raise FileNotFoundError(f"adapter {str(adapter)!r}: not an `lkv export` folder")
    LookaheadAdapter.read_folder(path)  # a missing or damaged file is named before the model loads
    net, tokenizer = load_backbone(
        model or exported_base_model(path) or DEFAULT_MODEL,
        dtype=dtype,
        attn_implementation=attn_implementation,
        device=device,
    )
    return net, tokenizer, LookaheadAdapter.load(path, net)
