"""Reference check of lkv's baselines against NVIDIA kvpress's implementations (docs/kvpress.md).

On one model and the same token ids, each method's kept set is computed twice per layer and KV head:

- kvpress: one prefill under a recording press that calls every kvpress press's ``score`` on each layer's
  keys, values, hidden states and attention weights (eager attention, so ``ObservedAttentionPress`` gets
  them); kept = ``scores.topk(n_kept)`` as ``ScorerPress`` does (``n_kept`` from
  ``PyramidKVPress.get_layer_budget`` for PyramidKV);
- lkv: one prefill with every press's attention capture (lkv's own fp32 capture), ``press.score``, then the
  shared selector at the same per-layer budgets with the method's protected window (+ the listed options).

The prefill's hidden states do not depend on what earlier layers evicted, so one prefill scores every
budget. ``scripts/kvpress_reference.py`` prints the table; ``tests/integrations`` pin it on tiny models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from kvpress import (
    BasePress,
    ObservedAttentionPress,
    PyramidKVPress,
    ScorerPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.utils import compute_n_kept
from transformers import DynamicCache, PreTrainedModel

from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill
from lkv.eviction.presses import Press, PressContext
from lkv.eviction.presses.selector import select_indices
from lkv.eviction.registry import make_method


@dataclass(frozen=True)
class Check:
    """One row group: a kvpress press, the lkv method + settings it is compared with, selector options."""

    label: str
    kvpress: ScorerPress
    lkv: str
    settings: dict = field(default_factory=dict)
    recent: int = 0  # lkv selector option (kvpress's TOVA always keeps the last token)


def default_checks(window: int = 64, kernel: int = 5) -> list[Check]:
    """The checks of docs/kvpress.md: each baseline at kvpress's settings, in lkv's default and matched form."""
    snap = {"window": window, "kernel": kernel}
    return [
        Check(
            "snapkv",
            SnapKVPress(window_size=window, kernel_size=kernel),
            "snapkv",
            {**snap, "pooling": "avg"},
        ),
        Check(
            "snapkv (avg_zero_pad)",
            SnapKVPress(window_size=window, kernel_size=kernel),
            "snapkv",
            {**snap, "pooling": "avg_zero_pad"},
        ),
        Check(
            "pyramidkv",
            PyramidKVPress(window_size=window, kernel_size=kernel, beta=20),
            "pyramidkv",
            {**snap, "pooling": "avg", "beta": 20},
        ),
        Check(
            "pyramidkv (avg_zero_pad)",
            PyramidKVPress(window_size=window, kernel_size=kernel, beta=20),
            "pyramidkv",
            {**snap, "pooling": "avg_zero_pad", "beta": 20},
        ),
        Check("streamingllm", StreamingLLMPress(n_sink=4), "streamingllm", {"sink": 4}),
        Check("tova", TOVAPress(), "tova", {}, recent=1),
        Check("tova (no last-token keep)", TOVAPress(), "tova", {}),
        Check("tova (kv_group)", TOVAPress(), "tova", {"ranking": "kv_group"}, recent=1),
        Check("h2o", ObservedAttentionPress(), "h2o", {"recent": 0}),
        Check(
            "h2o (visible_mean)", ObservedAttentionPress(), "h2o", {"recent": 0, "accumulate": "visible_mean"}
        ),
    ]


@dataclass
class _Recorder(BasePress):
    """Calls every kvpress press's ``score`` on each layer during one prefill, compresses nothing."""

    presses: dict[str, ScorerPress] = field(default_factory=dict)
    scores: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    modules: list = field(default_factory=list)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        self.modules.append(module)
        for name, press in self.presses.items():
            if isinstance(press, StreamingLLMPress):
                continue  # its scores depend on the ratio only: computed per budget below
            scores = press.score(module, hidden_states, keys, values, attentions, kwargs)
            self.scores.setdefault(name, []).append(scores.float().cpu())
        return keys, values


def kvpress_kept(recorder: _Recorder, check: Check, prompt_len: int, budget: int) -> list[torch.Tensor]:
    """Per layer the ``(1, kv_heads, n_l)`` positions kvpress keeps for ``budget`` tokens per head."""
    press = check.kvpress
    if isinstance(press, PyramidKVPress):
        ratio = 1 - budget / prompt_len  # its schedule rounds S · (1 − ratio)
    else:
        ratio = 1 - (budget + 0.5) / prompt_len  # compute_n_kept(S, ratio) == budget
        assert compute_n_kept(prompt_len, ratio) == budget
    press.compression_ratio = ratio
    kept = []
    for layer, module in enumerate(recorder.modules):
        if isinstance(press, StreamingLLMPress):
            shape = (1, module.config.num_key_value_heads, prompt_len, 1)
            scores = press.score(module, None, torch.zeros(shape), None, None, {})
        else:
            scores = recorder.scores[check.label][layer]
        n_kept = press.get_layer_budget(module, prompt_len) if isinstance(press, PyramidKVPress) else budget
        kept.append(scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values)
    return kept


def lkv_scored(model: PreTrainedModel, ids: torch.Tensor, presses: list[Press]) -> list[torch.Tensor]:
    """Every press's ``(1, layers, kv_heads, S)`` scores from one prefill carrying all their captures."""
    captures = [press.prefill_capture(ids.shape[1]) for press in presses]
    cache, logits = prefill(model, ids, lkv_capture=[c for c in captures if c is not None])
    return [
        press.score(PressContext(model, ids, cache, logits, capture))
        for press, capture in zip(presses, captures, strict=True)
    ]


def overlaps(lkv: list[torch.Tensor], reference: list[torch.Tensor]) -> list[float]:
    """``|A ∩ B| / |B|`` for every layer and KV head."""
    out = []
    for a, b in zip(lkv, reference, strict=True):
        for head in range(b.shape[1]):
            shared = len(set(a[0, head].tolist()) & set(b[0, head].tolist()))
            out.append(shared / b.shape[2])
    return out


def reference_overlaps(
    model: PreTrainedModel, ids: torch.Tensor, checks: Sequence[Check], budgets: dict[str, int]
) -> dict[tuple[str, str], list[float]]:
    """Overlap of lkv's and kvpress's kept sets per (check label, budget name), one value per layer and head.

    Args:
        model: a causal LM loaded with eager attention and lkv's capture (``load_backbone``).
        ids: ``(1, S)`` prompt token ids.
        checks: what to compare (:func:`default_checks`).
        budgets: name → tokens kept per KV head (e.g. ``{"64": 64, "S/2": S // 2}``).
    """
    prompt_len = ids.shape[1]
    recorder = _Recorder(presses={c.label: c.kvpress for c in checks})
    with recorder(model), torch.no_grad():
        model.model(input_ids=ids, **cache_kwargs(DynamicCache(config=model.config)))
    presses = [make_method(c.lkv, **c.settings) for c in checks]
    results: dict[tuple[str, str], list[float]] = {}
    for check, press, scores in zip(checks, presses, lkv_scored(model, ids, presses), strict=True):
        sink, recent = press.protected(prompt_len)
        for name, budget in budgets.items():
            reference = kvpress_kept(recorder, check, prompt_len, budget)
            layer_budgets = [index.shape[2] for index in reference]
            kept = select_indices(scores, layer_budgets, sink, max(recent, check.recent))
            results[(check.label, name)] = overlaps(kept, reference)
    return results


def describe(press: ScorerPress) -> str:
    """``SnapKVPress(window_size=64, kernel_size=5)``: the press and its settings other than the ratio."""
    settings = {k: v for k, v in vars(press).items() if k != "compression_ratio"}
    return f"{type(press).__name__}({', '.join(f'{k}={v}' for k, v in settings.items())})"
