"""Why the training-free competitors keep no needle on SmolLM2-135M: where each method's scores put a needle's
value tokens, and what each keeps instead (prefill only, no eviction decoded).

    OMP_NUM_THREADS=1 python experiments/competitor_diagnosis/why.py [--samples 1] [--out FOLDER] [--table-only]

For fresh needle prompts (the in-distribution fact formats, 1K tokens, depths 0.1/0.5/0.9, seed 3; the value
is a 7-digit number, one token per digit) it prefills once, scores the prompt with every method and, per
(layer, KV head), measures:

- ``value_pct``: the value tokens' mean score percentile among the prompt's tokens (100 = the top score);
- ``key_pct``: the same for the needle sentence's other tokens (its key phrase);
- ``value_kept``: the share of the value tokens in the method's kept set at ``C = 128`` (the selection an
  eviction makes: protected windows, pooling), and ``heads_all`` the share of heads that keep all of them;
- ``last10``: the share of the kept set inside the last 10 % of the prompt (how recency-bound it is);
- ``sentence_kept``: the share of the needle sentence's tokens kept (the key phrase and the value).

and, for Expected Attention's two factors apart, the value tokens' percentile under its expected-attention
term alone (``use_vnorm=False``) and under the value norm ``‖v‖`` alone. The Oracle is the FullKV answer's own
attention (teacher-forced). ``lookaheadkv`` is the full evaluation's module (512 prompts),
``lookaheadkv:demo`` the demo recipe (64 prompts) that the probe shares its labels with, both pooled (the
default); ``demo+probe`` the mean of those two per-head distributions. Writes ``FOLDER/why.md`` (means over samples, heads and layers, and per layer
third) and ``FOLDER/why.jsonl`` (one row per sample and method).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from lkv.core.chat import chat_parts
from lkv.core.generation import crop_to, decode
from lkv.core.importance import response_importance
from lkv.eval.prefill import shared_prefill
from lkv.eval.tasks import NeedleFamilyTask, encode_sample
from lkv.eval.tasks.needle_tokens import value_positions
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import PressContext
from lkv.eviction.presses.expected_attention import ExpectedAttentionPress
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.presses.probe import ProbePress
from lkv.eviction.registry import make_method
from lkv.model.backbone import load_backbone

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 128


def percentile(scores: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """``scores (layers, kv_heads, S)`` → ``(layers, kv_heads)`` mean percentile (0–100, 100 = top) of
    ``positions``' scores among the row's ``S`` scores (ties share the lower rank)."""
    finite = torch.nan_to_num(scores.float(), posinf=torch.finfo(torch.float32).max)
    ranks = finite.argsort(dim=-1).argsort(dim=-1).float()  # 0 = lowest
    return 100 * ranks[..., positions].mean(dim=-1) / (scores.shape[-1] - 1)


def kept_mask(kept: list[torch.Tensor], prompt_len: int) -> torch.Tensor:
    """Per layer ``(1, kv_heads, C_l)`` kept positions → ``(layers, kv_heads, S)`` bool."""
    mask = torch.zeros(len(kept), kept[0].shape[1], prompt_len, dtype=torch.bool)
    for layer, index in enumerate(kept):
        rows = index[0].clamp(min=0)
        mask[layer].scatter_(-1, rows, index[0] >= 0)
    return mask


def needle_span(sample, tokenizer) -> list[int]:
    """Prompt positions of the sentence that holds the asked value (the needle: key phrase and value)."""
    prefix = chat_parts(tokenizer)[0] if sample.chat else ""
    text = prefix + sample.context
    value = text.find(sample.answers[0], len(prefix))
    start, end = text.rfind(". ", 0, value) + 2, text.find(".", value) + 1
    encoded = tokenizer(text, add_special_tokens=not sample.chat, return_offsets_mapping=True)
    return [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < end and b > start]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1, help="samples per (family, depth) cell")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments/competitor_diagnosis")
    parser.add_argument("--adapter", type=Path, default=ROOT / "experiments/full_evidence/adapter")
    parser.add_argument("--demo-adapter", type=Path, default=ROOT / "runs/reach/base_s0")
    parser.add_argument("--probe", type=Path, default=ROOT / "runs/reach/probe_s0")
    parser.add_argument("--table-only", action="store_true", help="rewrite why.md from FOLDER/why.jsonl")
    args = parser.parse_args()
    if args.table_only:
        rows = [json.loads(line) for line in (args.out / "why.jsonl").read_text().splitlines()]
        return write_table(rows, args.out / "why.md")

    model, tokenizer = load_backbone()
    committed = LookaheadKVPress.from_folder(args.adapter, model)
    presses = {
        "expected_attention": make_method("expected_attention"),
        "ea_no_vnorm": ExpectedAttentionPress(use_vnorm=False),
        "snapkv": make_method("snapkv"),
        "keydiff": make_method("keydiff"),
        "kvzip": make_method("kvzip"),
        "probe": ProbePress.from_folder(args.probe, model),
        "lookaheadkv": committed,
        "lookaheadkv:demo": LookaheadKVPress.from_folder(
            args.demo_adapter, committed.adapter.model, adapter_name="lookahead_demo"
        ),
    }
    compressors = {name: Compressor(model, tokenizer, press) for name, press in presses.items()}
    task = NeedleFamilyTask(
        distribution="in", lengths=(1024,), depths=(0.1, 0.5, 0.9), samples_per_cell=args.samples, seed=3
    )
    eos = [tokenizer.eos_token_id]
    rows = []
    for sample in task.samples(tokenizer):
        context, question = encode_sample(sample, tokenizer)
        values = value_positions(sample, tokenizer)
        sentence = needle_span(sample, tokenizer)
        key = [p for p in sentence if p not in values]  # the needle's words around the value
        ids = torch.tensor([context + question])
        shared = shared_prefill(model, ids, presses)
        prompt_len = shared.prompt_len
        scores = {}
        for name, press in presses.items():
            ctx = PressContext(
                model, ids, shared.cache, shared.next_logits, shared.captures[name], eos, tokenizer
            )
            scores[name] = press.score(ctx)[0]  # (layers, kv_heads, S)
        # both trained rankings at once: the mean of the two per-head distributions
        fused = [scores[m] / scores[m].sum(dim=-1, keepdim=True) for m in ("lookaheadkv:demo", "probe")]
        scores["demo+probe"] = (fused[0] + fused[1]) / 2
        answer = decode(model, shared.cache, shared.next_logits, prompt_len, sample.max_new_tokens, eos)
        crop_to(shared.cache, prompt_len)
        solved = task.score(tokenizer.decode(answer, skip_special_tokens=True), sample)[task.metric]
        scores["oracle"] = response_importance(model, shared.cache, prompt_len, torch.tensor([answer]))
        vnorm = torch.stack([layer.values[0].float().norm(dim=-1) for layer in shared.cache.layers])
        for name, score in scores.items():
            selector = compressors.get(name, compressors["lookaheadkv"])
            mask = kept_mask(selector.select(score[None], BUDGET), prompt_len)  # with the method's windows
            tail = mask[..., int(0.9 * prompt_len) :].sum(-1) / mask.sum(-1)
            rows.append(
                {
                    "sample": sample.id,
                    "method": name,
                    "fullkv_solved": solved,
                    "value_pct": percentile(score, values).mean().item(),
                    "value_pct_by_third": [t.mean().item() for t in percentile(score, values).chunk(3)],
                    "key_pct": percentile(score, key).mean().item(),
                    "value_kept": mask[..., values].float().mean().item(),
                    "heads_all": mask[..., values].all(dim=-1).float().mean().item(),
                    "last10": tail.mean().item(),
                    "sentence_kept": mask[..., sentence].float().mean().item(),
                }
            )
        rows.append(
            {
                "sample": sample.id,
                "method": "value_norm",
                "fullkv_solved": solved,
                "value_pct": percentile(vnorm, values).mean().item(),
                "value_pct_by_third": [t.mean().item() for t in percentile(vnorm, values).chunk(3)],
                "key_pct": percentile(vnorm, key).mean().item(),
            }
        )
        print(sample.id, "solved" if solved else "unsolved", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "why.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_table(rows, args.out / "why.md")


def write_table(rows: list[dict], path: Path) -> None:
    """Means over samples of each method's measures (see the module docstring)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    n = len({r["sample"] for r in rows})
    lines = [
        f"n = {n} needle prompts (1K tokens, in-distribution fact formats, seed 3), C = {BUDGET} per KV head; "
        "means over samples of the (layer, KV head) means.",
        "",
        "| method | value tokens' score percentile (layers 1–10 / 11–20 / 21–30) | key phrase percentile | "
        "value tokens kept | heads keeping the whole value | needle sentence kept | kept set in the last 10 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        thirds = [statistics.mean(r["value_pct_by_third"][i] for r in mine) for i in range(3)]
        cells = [
            f"{statistics.mean(r['value_pct'] for r in mine):.0f} ({' / '.join(f'{t:.0f}' for t in thirds)})",
            f"{statistics.mean(r['key_pct'] for r in mine):.0f}",
        ]
        for key in ("value_kept", "heads_all", "sentence_kept", "last10"):
            cells.append(f"{statistics.mean(r[key] for r in mine):.2f}" if key in mine[0] else "")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
