"""Reference check of lkv's baselines against NVIDIA kvpress's implementations (docs/kvpress.md).

On the same model (the embedded SmolLM2-135M, eager attention so kvpress's ObservedAttentionPress gets its
attention weights) and the same token ids (held-out essay prompts in the chat template), each method's
kept set is computed twice per layer and KV head:

- kvpress: one prefill under a recording press that calls every kvpress press's ``score`` on each layer's
  keys, values, hidden states and eager attention; kept = ``scores.topk(n_kept)`` as ``ScorerPress`` does
  (``n_kept`` from ``PyramidKVPress.get_layer_budget`` for PyramidKV);
- lkv: one prefill with every press's attention capture (lkv's own fp32 capture), ``press.score``, then the shared selector at the same per-layer
  budgets with the method's protected window (+ the listed selector options).

The prefill's hidden states do not depend on what earlier layers evicted, so one prefill scores every
budget. Printed: per method and budget ``C`` (64, 128, S/2), the overlap ``|lkv ∩ kvpress| / C_l`` over all
layers, KV heads and prompts (min and mean). Run in the kvpress environment (``make kvpress-env``)::

    .venv-kvpress/bin/python scripts/kvpress_reference.py --prompts 6
"""

from __future__ import annotations

import argparse
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
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill
from lkv.eviction.presses import Press, PressContext
from lkv.eviction.presses.selector import select_indices
from lkv.eviction.registry import make_method
from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.model.backbone import load_backbone


@dataclass(frozen=True)
class Check:
    """One row group: a kvpress press, the lkv method + settings it is compared with, selector options."""

    label: str
    kvpress: ScorerPress
    lkv: str
    settings: dict = field(default_factory=dict)
    recent: int = 0  # lkv selector option (kvpress's TOVA always keeps the last token)
    # > 0: lkv's unpooled SnapKV scores, avg-pooled here as kvpress pools (zero padding counted at the edges)
    pad_counted_pool: int = 0


CHECKS = [
    Check(
        "snapkv",
        SnapKVPress(window_size=64, kernel_size=5),
        "snapkv",
        {"window": 64, "kernel": 5, "pooling": "avg"},
    ),
    Check(
        "snapkv (pooled as kvpress)",
        SnapKVPress(window_size=64, kernel_size=5),
        "snapkv",
        {"window": 64, "kernel": 1},
        pad_counted_pool=5,
    ),
    Check(
        "pyramidkv",
        PyramidKVPress(window_size=64, kernel_size=5, beta=20),
        "pyramidkv",
        {"window": 64, "kernel": 5, "pooling": "avg", "beta": 20},
    ),
    Check("streamingllm", StreamingLLMPress(n_sink=4), "streamingllm", {"sink": 4}),
    Check("tova", TOVAPress(), "tova", {}, recent=1),
    Check("tova (no last-token keep)", TOVAPress(), "tova", {}),
    Check("tova (kv_group)", TOVAPress(), "tova", {"ranking": "kv_group"}, recent=1),
    Check("h2o", ObservedAttentionPress(), "h2o", {"recent": 0}),
    Check("h2o (visible_mean)", ObservedAttentionPress(), "h2o", {"recent": 0, "accumulate": "visible_mean"}),
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
    """Per layer ``(1, kv_heads, n_l)`` positions kvpress keeps for ``budget`` tokens per head, and ``n_l``."""
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


def lkv_scored(model, ids: torch.Tensor, presses: list[Press]) -> list[tuple[Press, torch.Tensor]]:
    """Every press's ``(1, layers, kv_heads, S)`` scores from one prefill carrying all their captures."""
    captures = [press.prefill_capture(ids.shape[1]) for press in presses]
    cache, logits = prefill(model, ids, lkv_capture=[c for c in captures if c is not None])
    return [
        (press, press.score(PressContext(model, ids, cache, logits, capture)))
        for press, capture in zip(presses, captures, strict=True)
    ]


def describe(press: ScorerPress) -> str:
    """``SnapKVPress(window_size=64, kernel_size=5)``: the press and its settings other than the ratio."""
    settings = {k: v for k, v in vars(press).items() if k != "compression_ratio"}
    return f"{type(press).__name__}({', '.join(f'{k}={v}' for k, v in settings.items())})"


def overlaps(lkv: list[torch.Tensor], reference: list[torch.Tensor]) -> list[float]:
    """``|A ∩ B| / |B|`` for every layer and KV head."""
    out = []
    for a, b in zip(lkv, reference, strict=True):
        for head in range(b.shape[1]):
            shared = len(set(a[0, head].tolist()) & set(b[0, head].tolist()))
            out.append(shared / b.shape[2])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    parser.add_argument("--min-words", type=int, default=900)
    parser.add_argument("--max-words", type=int, default=1400)
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_backbone("smollm2-135m", attn_implementation="eager")
    source = BuiltinPrompts(
        split="heldout",
        num_prompts=args.prompts,
        min_words=args.min_words,
        max_words=args.max_words,
        retrieval_fraction=0.0,
        code_fraction=0.0,
    )
    results: dict[tuple[str, str], list[float]] = {}
    lengths = []
    for prompt in source:
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        prompt_len = ids.shape[1]
        lengths.append(prompt_len)
        recorder = _Recorder(presses={c.label: c.kvpress for c in CHECKS})
        with recorder(model), torch.no_grad():
            model.model(input_ids=ids, **cache_kwargs(DynamicCache(config=model.config)))
        lkv_scores = lkv_scored(model, ids, [make_method(c.lkv, **c.settings) for c in CHECKS])
        for check, (press, scores) in zip(CHECKS, lkv_scores, strict=True):
            if check.pad_counted_pool:
                split = prompt_len - check.settings["window"]
                prefix = torch.nn.functional.avg_pool1d(
                    scores[0, :, :, :split], check.pad_counted_pool, 1, check.pad_counted_pool // 2
                )
                scores = torch.cat([prefix[None], scores[..., split:]], dim=-1)
            sink, recent = press.protected(prompt_len)
            for name, budget in (("64", 64), ("128", 128), ("S/2", prompt_len // 2)):
                reference = kvpress_kept(recorder, check, prompt_len, budget)
                budgets = [index.shape[2] for index in reference]
                kept = select_indices(scores, budgets, sink, max(recent, check.recent))
                results.setdefault((check.label, name), []).extend(overlaps(kept, reference))
        print(f"prompt {prompt.id}: {prompt_len} tokens", flush=True)

    print(f"\n{len(lengths)} held-out prompts of {min(lengths)}–{max(lengths)} tokens, SmolLM2-135M, eager\n")
    print("| method | lkv settings | kvpress press | C | min overlap | mean overlap |")
    print("|---|---|---|---|---|---|")
    for check in CHECKS:
        settings = ", ".join(f"{k}={v}" for k, v in check.settings.items())
        if check.pad_counted_pool:
            settings += f", then avg pool {check.pad_counted_pool} counting the zero padding"
        if check.recent:
            settings += f"{', ' if settings else ''}selector recent={check.recent}"
        for name in ("64", "128", "S/2"):
            values = results[(check.label, name)]
            print(
                f"| {check.label} | {settings or 'defaults'} | `{describe(check.kvpress)}` | {name} | "
                f"{min(values):.3f} | {sum(values) / len(values):.4f} |"
            )


if __name__ == "__main__":
    main()
