"""Trained lkv adapters (and lkv's other layer-streamable presses) as presses of NVIDIA kvpress.

kvpress (``pip install 'lkv[kvpress]'``; it pins ``transformers<5.3``, so ``make kvpress-test`` builds its own
environment) compresses each layer's cache from a forward hook on its attention module, during the
context's prefill. :class:`LkvPress` plugs lkv's layer-streamed eviction
(:class:`~lkv.eviction.streamed.LayerEvictor`) into that hook, so the scores, budgets and kept positions are
exactly those of ``Compressor(..., streamed=True)``:

- a pre-hook on the decoder reads the context ids, builds the evictor (budget ``C = kvpress's n_kept(S, ratio)``
  per KV head, spread over layers by the press's schedule) and adds the press's attention capture to the
  prefill's keywords;
- kvpress's hook on attention module ``l`` then calls :meth:`LkvPress.compress`: the evictor scores layer
  ``l`` — for LookaheadKV it runs the ``M`` lookahead tokens through layer ``l`` with the adapter on, beside
  the prefill (:class:`~lkv.model.lookahead.LookaheadStream`) — and the layer's K/V are cut to the kept
  positions before layer ``l + 1`` runs.

Usage with kvpress's pipeline, question-agnostic (the context is compressed before the question is seen)::

    model, tokenizer = load_backbone("smollm2-135m")
    press = lookahead_press("runs/adapter", model, compression_ratio=0.75)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    pipe(context, question="What is the magic number?", press=press)["answer"]

With a preset (:mod:`lkv.eviction.presses.lookahead_settings`, as ``lkv generate --preset``), e.g. the
long-prompt one, which fuses a trained per-token probe (default: the adapter folder's ``probe/``) and reads
sentence ends from the tokenizer::

    press = lookahead_press("runs/adapter", model, 0.75, settings="long", tokenizer=tokenizer)
    press = lookahead_press("runs/adapter", model, 0.75, probe="runs/probe", settings={"preset": "long", "kernel": 5},
                            tokenizer=tokenizer)

Without ``settings`` the folder's recorded preset applies (else ``pooled``).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvpress import BasePress
from kvpress.utils import compute_n_kept
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.attention import install_capture
from lkv.core.cache import gather_layer
from lkv.eviction.presses import Press, ProbePress
from lkv.eviction.presses.lookaheadkv import Settings, check_tokenizer, folder_defaults
from lkv.eviction.presses.lookaheadkv import lookahead_press as module_press
from lkv.eviction.selector import DEFAULT_SELECTION, Selection, adaptive_width
from lkv.eviction.streamed import LayerEvictor
from lkv.model.lookahead import LookaheadAdapter

# the cache keyword kvpress's pipeline passes (transformers < 5.24), and the one newer transformers reads
_CACHE_KEYWORDS = ("past_key_values", "cache")


@dataclass
class LkvPress(BasePress):
    """A layer-streamable lkv press (:attr:`~lkv.eviction.presses.base.Press.streamable`) as a kvpress press.

    Args:
        press: the lkv press, e.g. ``make_method("snapkv", window=64)`` or a loaded LookaheadKV
            (:func:`lookahead_press`).
        compression_ratio: the fraction of the context's entries to drop, kvpress's convention: each KV head
            of each layer keeps ``C = max(1, int(S · (1 − ratio)))``; 0 compresses nothing.
        selection: lkv's selector settings (:class:`~lkv.eviction.selector.Selection`) on top of the press's
            own protected window; its ``head_budget="adaptive"`` spreads each layer's ``C · kv_heads`` entries
            over its heads by score (AdaKV, as kvpress's ``AdaKVPress``), each head keeping ``safeguard · C``.

    Every layer must keep the same count: kvpress's pipeline appends the question as one block, which a cache
    with layers of different lengths cannot mask (so PyramidKV's schedule is refused here). Under ``adaptive``
    head budgets every layer is therefore gathered to one width known before any layer is scored, the most
    one head can keep (:func:`~lkv.eviction.selector.adaptive_width`: ``C · kv_heads`` less the other
    heads' safeguard, at most ``S``); the shorter heads' slots are masked (:mod:`lkv.core.cache`).
    kvpress's own ``AdaKVPress`` keeps all ``S`` entries and masks the evicted ones.
    """

    press: Press
    compression_ratio: float = 0.0
    selection: Selection = DEFAULT_SELECTION
    _model: PreTrainedModel | None = field(default=None, init=False, repr=False)
    _evictor: LayerEvictor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.press.streamable:
            raise ValueError(
                f"{self.press.name} needs the whole prompt before it scores a layer; kvpress compresses each "
                "layer during the prefill, so only layer-streamable presses can run there"
            )
        if not 0 <= self.compression_ratio < 1:
            raise ValueError(f"compression_ratio must be in [0, 1), got {self.compression_ratio}")

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Route the model's attention through lkv's capture (idempotent; outputs unchanged)."""
        install_capture(model)
        self._model = model

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Generator[None, None, None]:
        """kvpress's hooks on every attention module, plus a pre-hook on the decoder that starts the evictor."""
        decoder = model.model.language_model if hasattr(model.model, "language_model") else model.model
        handle = decoder.register_forward_pre_hook(self._start, with_kwargs=True)
        try:
            with super().__call__(model):
                yield
            if self._evictor is not None:
                self._evictor.check_done()
        finally:
            handle.remove()
            self._evictor = None

    def _start(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Decoder pre-hook: on a prefill into an empty cache, build the evictor and add its capture."""
        ids = kwargs.get("input_ids")
        cache = next((kwargs[name] for name in _CACHE_KEYWORDS if kwargs.get(name) is not None), None)
        if self.compression_ratio == 0 or ids is None or cache is None or cache.get_seq_length() != 0:
            return None
        if ids.shape[0] != 1:
            raise ValueError(f"lkv presses compress one sequence at a time, got a batch of {ids.shape[0]}")
        prompt_len = ids.shape[1]
        num_layers = self._model.config.num_hidden_layers
        budget = compute_n_kept(prompt_len, self.compression_ratio)
        budgets = self.press.layer_budgets(budget, prompt_len, num_layers)
        if len({min(b, prompt_len) for b in budgets}) > 1:
            raise ValueError(
                f"{self.press.name} keeps different counts per layer ({min(budgets)}..{max(budgets)}); kvpress's "
                "pipeline appends the question as one block, which needs every layer at the same length"
            )
        kv_heads = self._model.config.num_key_value_heads
        self._evictor = LayerEvictor(
            self._model,
            self.press,
            ids,
            cache,
            budgets,
            self.selection.protecting(*self.press.protected(prompt_len)),
            width=adaptive_width(budget, kv_heads, prompt_len, self.selection.safeguard),
        )
        return args, {**kwargs, **self._evictor.forward_kwargs}

    def forward_hook(self, module: nn.Module, input: list[torch.Tensor], kwargs: dict, output: list):
        # Outside an lkv prefill, or while the evictor runs the layer again for the lookahead tokens: no-op.
        if self._evictor is None or self._evictor.busy:
            return output
        return super().forward_hook(module, input, kwargs, output)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(1, kv_heads, S, head_dim)`` of layer ``module.layer_idx`` (the cache layer's own) →
        ``(1, kv_heads, C, head_dim)``, the positions lkv's selector keeps for that layer, in their original
        order (under ``adaptive`` head budgets with masked padding slots; the mask stays on the cache layer)."""
        cache = next(kwargs[name] for name in _CACHE_KEYWORDS if kwargs.get(name) is not None)
        gather_layer(cache, module.layer_idx, self._evictor.select(module.layer_idx))
        layer = cache.layers[module.layer_idx]
        return layer.keys, layer.values


def lookahead_press(
    adapter: str | Path,
    model: PreTrainedModel,
    compression_ratio: float = 0.0,
    probe: str | Path | None = None,
    settings: Settings | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    **options,
) -> LkvPress:
    """A trained LookaheadKV module (an ``lkv export`` folder) as a kvpress press for ``model``, built as lkv's
    own press (:func:`lkv.eviction.presses.lookaheadkv.lookahead_press`).

    The adapter's LoRA is injected into ``model`` in place and stays off outside the lookahead tokens, so the
    model still computes the base model for the context, the question and the answer; give the same model to
    kvpress's pipeline.

    Args:
        adapter: the exported folder; model: the base model it was trained on (e.g. ``load_backbone(...)[0]``).
        compression_ratio, options: as :class:`LkvPress`.
        probe: an ``lkv export`` probe folder for the same base model, fused with the module when the settings
            fuse one (default: the adapter folder's ``probe/``).
        settings: a preset name, a mapping of settings (``{"preset": "long", "kernel": 5}``) or a
            :class:`~lkv.eviction.presses.lookahead_settings.LookaheadKVSettings` (default: the folder's preset,
            else ``pooled``).
        tokenizer: the model's tokenizer (settings with a sentence share read sentence ends from it).

    Raises:
        ValueError: for settings lkv's press refuses, a probe the settings do not fuse, or a fusion without a
            probe (before anything is loaded).
    """
    defaults = folder_defaults(adapter)
    checked = defaults.settings(settings)
    if probe is not None and not checked.needs_probe:
        raise ValueError(f"probe={str(probe)!r}: the settings fuse no probe (probe_weight 0)")
    probe = defaults.probe_for(checked, probe, f"adapter {str(adapter)!r}")
    check_tokenizer(checked, tokenizer)
    install_capture(model)
    module = LookaheadAdapter.load(adapter, model)
    probe_press = None if probe is None else ProbePress.from_folder(probe, model)
    return LkvPress(module_press(module, probe_press, checked, tokenizer), compression_ratio, **options)
