"""Probe: a learned per-token probe (KVzap-style) scores each prompt token from its own hidden state."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from lkv.core.attention import HiddenCapture
from lkv.eviction.presses.base import LayerScorer, Press, PressContext, StreamContext
from lkv.model.probe import ImportanceProbe


class ProbePress(Press):
    """Scores = softmax over ``S`` of the probe's logits on each layer's attention input (lkv.model.probe).

    KVzap (arXiv:2601.07891; NVIDIA kvpress's ``KVzapPress``) with lkv's selector: the top-``C`` per KV head
    instead of kvpress's score threshold (``DMSPress``), so budgets match every other method. The probe runs
    on each layer's input inside the prefill's pre-attention hook
    (:class:`~lkv.core.attention.HiddenCapture`), so only its ``(1, kv_heads, S)`` scores are kept per layer,
    and layer ``l``'s scores are ready as soon as the prompt has passed layer ``l`` (layer-streamed eviction).
    No tokens are appended to the cache.
    """

    name = "probe"
    streamable = True

    def __init__(self, probe: ImportanceProbe) -> None:
        self.probe = probe

    @classmethod
    def from_folder(cls, folder: str | Path, model: PreTrainedModel) -> ProbePress:
        """Load an ``lkv export`` probe folder for ``model`` (its shape is checked)."""
        return cls(ImportanceProbe.load(folder, model))

    def _layer_scores(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden (1, S, hidden)`` → ``(1, kv_heads, S)``, each row summing to 1."""
        return torch.softmax(self.probe.layer_logits(layer_idx, hidden), dim=-1)

    def prefill_capture(self, prompt_len: int) -> HiddenCapture:
        return HiddenCapture(self._layer_scores)

    def score(self, ctx: PressContext) -> torch.Tensor:
        self.probe.check_model(ctx.model)
        return ctx.capture.stacked(ctx.model.config.num_hidden_layers)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        self.probe.check_model(ctx.model)
        return ctx.capture.take
