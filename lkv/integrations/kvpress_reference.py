"""Reference check of lkv's baselines against NVIDIA kvpress's implementations (docs/kvpress.md).

On one model and the same token ids, each method's kept set is computed twice per layer and KV head:

- kvpress: one prefill under a recording press that calls every kvpress press's ``score`` on each layer's
  keys, values, hidden states and attention weights (eager attention, so ``ObservedAttentionPress`` gets
  them); kept = ``scores.topk(n_kept)`` as ``ScorerPress`` does (``n_kept`` from
  ``PyramidKVPress.get_layer_budget`` for PyramidKV). ``AdaKVPress`` selects for itself: its ``compress`` runs
  on each recorded layer per budget and the entries it masks (``masked_key_indices``) are the evicted ones.
  ``KVzipPress`` runs its own prefill and reconstruction passes; its scores give the per-head top-``C``
  (``selection="scores"``), its layer-wise selection over the heads its own kept sets (``selection="press"``);
- lkv: one prefill with every press's attention capture (lkv's own fp32 capture), ``press.score``, then the
  shared selector at the same per-layer budgets with the method's protected window (+ the listed options,
  ``adaptive`` head budgets for AdaKV and KVzip's own selection).

The prefill's hidden states do not depend on what earlier layers evicted, so one prefill scores every
budget. Overlap per layer and KV head is ``|lkv ∩ kvpress| / max(|lkv|, |kvpress|)`` (``/ C`` where both keep
``C``). ``scripts/kvpress_reference.py`` prints the table; ``tests/integrations`` pin it on tiny models.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from kvpress import (
    AdaKVPress,
    BasePress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KVzipPress,
    ObservedAttentionPress,
    PyramidKVPress,
    ScorerPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.utils import compute_n_kept
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill
from lkv.eviction.presses import Press, PressContext
from lkv.eviction.presses.kvzip import template_parts
from lkv.eviction.registry import make_method
from lkv.eviction.selector import DEFAULT_SELECTION, SAFEGUARD, Selection, select_indices
from lkv.labels.builtin_prompts import BuiltinPrompts


@dataclass(frozen=True)
class Check:
    """One row group: a kvpress press, the lkv method + settings it is compared with, selector settings.

    ``selection``: ``scores`` compares with the top-``C`` of kvpress's scores per head; ``press`` with the
    kept set kvpress's press chooses itself (AdaKV, KVzip's layer-wise selection).
    """

    label: str
    kvpress: BasePress
    lkv: str
    settings: dict = field(default_factory=dict)
    selector: Selection = DEFAULT_SELECTION  # lkv's (kvpress's TOVA always keeps the last token: recent=1)
    selection: str = "scores"


def default_checks(template_sink: int, window: int = 64, kernel: int = 5) -> list[Check]:
    """The checks of docs/kvpress.md: each baseline at kvpress's settings, in lkv's default and matched form.

    Args:
        template_sink: the chat template's opening the prompts start with, in tokens (:func:`kvzip_sink`):
            kvpress's ``n_sink`` for KVzip in the matched rows (lkv's KVzip keeps that opening, as the paper
            keeps the system prompt).
        window, kernel: SnapKV's and PyramidKV's settings.
    """
    snap = {"window": window, "kernel": kernel}
    zero_pad = {**snap, "pooling": "avg_zero_pad"}
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
        Check("tova", TOVAPress(), "tova", {}, selector=Selection(recent=1)),
        Check("tova (no last-token keep)", TOVAPress(), "tova", {}),
        Check("tova (kv_group)", TOVAPress(), "tova", {"ranking": "kv_group"}, selector=Selection(recent=1)),
        Check("h2o", ObservedAttentionPress(), "h2o", {"recent": 0}),
        Check(
            "h2o (visible_mean)", ObservedAttentionPress(), "h2o", {"recent": 0, "accumulate": "visible_mean"}
        ),
        Check("expected_attention", ExpectedAttentionPress(), "expected_attention"),
        Check("keydiff", KeyDiffPress(), "keydiff"),
        Check(
            "adakv(snapkv)",
            AdaKVPress(SnapKVPress(window_size=window, kernel_size=kernel), alpha_safeguard=SAFEGUARD),
            "snapkv",
            zero_pad,
            selector=Selection(head_budget="adaptive"),
            selection="press",
        ),
        Check(
            "adakv(snapkv) (avg)",
            AdaKVPress(SnapKVPress(window_size=window, kernel_size=kernel), alpha_safeguard=SAFEGUARD),
            "snapkv",
            {**snap, "pooling": "avg"},
            selector=Selection(head_budget="adaptive"),
            selection="press",
        ),
        Check("kvzip", KVzipPress(n_sink=template_sink, layerwise=True), "kvzip"),
        Check(
            "kvzip (adaptive, layerwise)",
            KVzipPress(n_sink=template_sink, layerwise=True),
            "kvzip",
            selector=Selection(head_budget="adaptive", safeguard=0.0),
            selection="press",
        ),
        Check("kvzip (kvpress n_sink=4)", KVzipPress(n_sink=4, layerwise=True), "kvzip"),
    ]


@dataclass
class _Recorder(BasePress):
    """Calls every kvpress scorer's ``score`` on each layer during one prefill and keeps each layer's inputs
    for the presses that select for themselves (AdaKV); compresses nothing."""

    presses: dict[str, ScorerPress] = field(default_factory=dict)
    scores: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    modules: list = field(default_factory=list)
    inputs: list[tuple] = field(default_factory=list)
    keep_inputs: bool = False

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        self.modules.append(module)
        if self.keep_inputs:  # attention weights are left out (S² per head; AdaKV's scorers do not read them)
            self.inputs.append((hidden_states, keys, values, kwargs))
        for name, press in self.presses.items():
            if isinstance(press, StreamingLLMPress):
                continue  # its scores depend on the ratio only: computed per budget below
            scores = press.score(module, hidden_states, keys, values, attentions, kwargs)
            self.scores.setdefault(name, []).append(scores.float().cpu())
        return keys, values


@dataclass
class _KVzipRecorder(KVzipPress):
    """kvpress's KVzip with its final step recorded: the scores, and its own kept sets at several ratios."""

    ratios: dict[str, float] = field(default_factory=dict)
    recorded: torch.Tensor | None = None
    kept: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def compress_post(self, model: PreTrainedModel) -> None:
        for name, ratio in self.ratios.items():
            self.compression_ratio = ratio
            super().compress_post(model)  # gives the sinks the top score, then picks the evicted entries
            if self.recorded is None:
                self.recorded = self.score_val[:, 0].float().cpu().clone()  # (layers, kv_heads, S)
            self.kept[name] = [
                kept_from_masked(layer.self_attn.masked_key_indices, *self.score_val.shape[2:])
                for layer in model.model.layers
            ]


def kept_from_masked(masked: tuple[torch.Tensor, ...], kv_heads: int, length: int) -> torch.Tensor:
    """kvpress's ``masked_key_indices`` ``(batch, head, position)`` of one sequence → ``(1, kv_heads, W)`` kept
    positions per head, ascending, padded with ``-1`` (lkv's selector's layout)."""
    keep = torch.ones(kv_heads, length, dtype=torch.bool)
    keep[masked[1].cpu(), masked[2].cpu()] = False
    width = int(keep.sum(dim=-1).max())
    rows = torch.where(keep, torch.arange(length), length).sort(dim=-1).values[:, :width]
    return rows.masked_fill(rows == length, -1)[None]


def kvpress_ratio(budget: int, prompt_len: int) -> float:
    """The compression ratio for which kvpress keeps ``budget`` entries per head (``compute_n_kept``)."""
    ratio = 1 - (budget + 0.5) / prompt_len
    assert compute_n_kept(prompt_len, ratio) == budget
    return ratio


def kvpress_kept(recorder: _Recorder, check: Check, prompt_len: int, budget: int) -> list[torch.Tensor]:
    """Per layer the ``(1, kv_heads, n_l)`` positions kvpress keeps for ``budget`` tokens per head."""
    press = check.kvpress
    if isinstance(press, PyramidKVPress):
        ratio = 1 - budget / prompt_len  # its schedule rounds S · (1 − ratio)
    else:
        ratio = kvpress_ratio(budget, prompt_len)
    press.compression_ratio = ratio
    kept = []
    for layer, module in enumerate(recorder.modules):
        if isinstance(press, AdaKVPress):
            hidden_states, keys, values, kwargs = recorder.inputs[layer]
            press.compress(module, hidden_states, keys, values, None, kwargs)
            kept.append(kept_from_masked(module.masked_key_indices, keys.shape[1], prompt_len))
            module.masked_key_indices = None
            continue
        if isinstance(press, StreamingLLMPress):
            shape = (1, module.config.num_key_value_heads, prompt_len, 1)
            scores = press.score(module, None, torch.zeros(shape), None, None, {})
        else:
            scores = recorder.scores[check.label][layer]
        n_kept = press.get_layer_budget(module, prompt_len) if isinstance(press, PyramidKVPress) else budget
        kept.append(scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values)
    return kept


def kvzip_kept(
    model: PreTrainedModel, ids: torch.Tensor, check: Check, budgets: dict[str, int]
) -> dict[str, list[torch.Tensor]]:
    """kvpress KVzip's kept positions per budget name: its own layer-wise selection over the heads
    (``selection="press"``, ``C · kv_heads`` entries per layer) or the top-``C`` of its scores per head."""
    prompt_len, kv_heads = ids.shape[1], model.config.num_key_value_heads
    # layer-wise, kvpress evicts int(kv_heads · S · ratio) entries of each layer: keep C · kv_heads
    ratios = {
        name: (kv_heads * (prompt_len - c) + 0.5) / (kv_heads * prompt_len) for name, c in budgets.items()
    }
    press = check.kvpress
    recorder = _KVzipRecorder(
        compression_ratio=next(iter(ratios.values())),
        n_sink=press.n_sink,
        layerwise=press.layerwise,
        chunk_size=press.chunk_size,
        ratios=ratios,
    )
    with recorder(model), torch.no_grad():
        model.model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    if check.selection == "press":
        return recorder.kept
    scores = recorder.recorded
    return {
        name: [
            scores[layer : layer + 1].topk(c, dim=-1).indices.sort(dim=-1).values
            for layer in range(len(scores))
        ]
        for name, c in budgets.items()
    }


def lkv_scored(
    model: PreTrainedModel,
    ids: torch.Tensor,
    presses: list[Press],
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> list[torch.Tensor]:
    """Every press's ``(1, layers, kv_heads, S)`` scores from one prefill carrying all their captures."""
    captures = [press.prefill_capture(ids.shape[1]) for press in presses]
    cache, logits = prefill(model, ids, lkv_capture=[c for c in captures if c is not None])
    return [
        press.score(PressContext(model, ids, cache, logits, capture, tokenizer=tokenizer))
        for press, capture in zip(presses, captures, strict=True)
    ]


def overlaps(lkv: list[torch.Tensor], reference: list[torch.Tensor]) -> list[float]:
    """``|A ∩ B| / max(|A|, |B|)`` for every layer and KV head (``-1`` entries are padding)."""
    out = []
    for a, b in zip(lkv, reference, strict=True):
        for head in range(b.shape[1]):
            mine, theirs = set(a[0, head].tolist()) - {-1}, set(b[0, head].tolist()) - {-1}
            out.append(len(mine & theirs) / max(len(mine), len(theirs), 1))
    return out


def reference_overlaps(
    model: PreTrainedModel,
    ids: torch.Tensor,
    checks: Sequence[Check],
    budgets: dict[str, int],
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> dict[tuple[str, str], list[float]]:
    """Overlap of lkv's and kvpress's kept sets per (check label, budget name), one value per layer and head.

    Args:
        model: a causal LM loaded with eager attention and lkv's capture (``load_backbone``); for KVzip,
            ``model.config.name_or_path`` must hold its tokenizer (kvpress loads it from there).
        ids: ``(1, S)`` prompt token ids.
        checks: what to compare (:func:`default_checks`).
        budgets: name → tokens kept per KV head (e.g. ``{"64": 64, "S/2": S // 2}``).
        tokenizer: the model's tokenizer (lkv's KVzip writes its repeat prompt with it).
    """
    prompt_len = ids.shape[1]
    scorers = {c.label: c.kvpress for c in checks if isinstance(c.kvpress, ScorerPress)}
    recorder = _Recorder(presses=scorers, keep_inputs=any(isinstance(c.kvpress, AdaKVPress) for c in checks))
    with recorder(model), torch.no_grad():
        model.model(input_ids=ids, **cache_kwargs(DynamicCache(config=model.config)))
    presses = [make_method(c.lkv, **c.settings) for c in checks]
    results: dict[tuple[str, str], list[float]] = {}
    for check, press, scores in zip(checks, presses, lkv_scored(model, ids, presses, tokenizer), strict=True):
        sink, recent = press.protected(prompt_len)
        kvzip = kvzip_kept(model, ids, check, budgets) if isinstance(check.kvpress, KVzipPress) else None
        for name, budget in budgets.items():
            reference = (
                kvzip[name] if kvzip is not None else kvpress_kept(recorder, check, prompt_len, budget)
            )
            layer_budgets = [
                budget if check.selector.head_budget == "adaptive" else index.shape[2] for index in reference
            ]
            kept = select_indices(scores, layer_budgets, check.selector.protecting(sink, recent))
            results[(check.label, name)] = overlaps(kept, reference)
    return results


def heldout_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: int, min_words: int, max_words: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(id, ids (1, S))`` of ``prompts`` held-out essay prompts (no retrieval or code prompts) of
    ``min_words``–``max_words`` words, in the chat template: the scripts' reference prompts."""
    source = BuiltinPrompts(
        split="heldout",
        num_prompts=prompts,
        min_words=min_words,
        max_words=max_words,
        retrieval_fraction=0.0,
        code_fraction=0.0,
    )
    for prompt in source:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, return_tensors="pt")
        yield prompt.id, ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def kvzip_sink(tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor) -> int:
    """The chat template's opening that ``ids (1, S)`` starts with, in tokens (lkv's KVzip sink)."""
    return template_parts(tokenizer, ids[0].tolist())[0]


def describe(press: BasePress) -> str:
    """``SnapKVPress(window_size=64, kernel_size=5)``: the press and its settings other than the ratio (and
    KVzip's internal state)."""
    if isinstance(press, AdaKVPress):
        return f"AdaKVPress({describe(press.press)}, alpha_safeguard={press.alpha_safeguard})"
    if isinstance(press, KVzipPress):
        return (
            f"KVzipPress(n_sink={press.n_sink}, layerwise={press.layerwise}, chunk_size={press.chunk_size})"
        )
    settings = {k: v for k, v in vars(press).items() if k != "compression_ratio"}
    return f"{type(press).__name__}({', '.join(f'{k}={v}' for k, v in settings.items())})"
