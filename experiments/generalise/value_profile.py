"""Where a recipe's selection sits around a lost needle: per prompt token from a little before the fact's key to
just after its value, the share of (layer, KV head)s whose top-C keeps that token, for a module's selections.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python experiments/generalise/value_profile.py \
        [--answers experiments/generalise/results/dev_mix] [--method lookaheadkv] [--adapter FOLDER] \
        [--presets long pooled paper] [--budget 128] [--needles 3] > profile.md

The needles are the first ``--needles`` of the dev set (configs/dev.yaml's selection) that FullKV answers and
``--method`` loses at ``--budget`` in the ``--answers`` folder; ``--adapter`` is that method's module folder
(its ``probe/`` fuses where a preset says so). The end-task rows say *that* a needle is lost; this says *which*
tokens around it the selection keeps: the words that match the question (the key phrase) or the value the answer
copies. Prefill and scoring only, ~1 min of one core per needle and preset.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from lkv.core.importance import response_importance
from lkv.eval.prefill import shared_prefill
from lkv.eval.tasks import GeneraliseTask, encode_sample
from lkv.eval.tasks.needle_tokens import value_positions
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import OraclePress, ProbePress
from lkv.eviction.presses.lookaheadkv import folder_defaults, load_module, lookahead_press

BEFORE = 12  # tokens shown before the value: the key phrase of every fact kind's statement fits
AFTER = 3  # ... and after it


def kept_profile(kept: Sequence[torch.Tensor], positions: range) -> list[float]:
    """Per position of ``positions``, the share of (layer, KV head)s whose kept set (``(1, kv_heads, C_l)`` per
    layer) holds it."""
    wanted = torch.tensor(list(positions))
    # per layer (kv_heads, C_l, P) → (kv_heads, P); layers may keep different C_l
    hits = torch.cat([(k[0][..., None] == wanted).any(dim=1) for k in kept])  # (layers · kv_heads, P)
    return hits.float().mean(dim=0).tolist()


def lost_needles(answers: Path, method: str, budget: str) -> dict[str, tuple[dict, list[int]]]:
    """Sample id → (its ``method`` row, FullKV's answer ids), for the needles FullKV answers and ``method`` loses
    at ``budget``."""
    rows = [json.loads(line) for line in (answers / "results.jsonl").open()]
    solved = {r["sample"]: r["answer_ids"] for r in rows if r["method"] == "fullkv" and r["score"] == 1.0}
    return {
        r["sample"]: (r, solved[r["sample"]])
        for r in rows
        if r["method"] == method and r["budget"] == budget and r["sample"] in solved and r["score"] < 1.0
    }


def oracle_kept(
    net: PreTrainedModel, ids: torch.Tensor, answer_ids: list[int], budget: int
) -> list[torch.Tensor]:
    """The Oracle's kept sets at ``budget``: the top-C of FullKV's answer's attention on the prompt ``ids``
    ``(1, S)`` (teacher-forced on the full cache, as ``lkv eval`` scores ``oracle``)."""
    shared = shared_prefill(net, ids, {})
    scores = response_importance(net, shared.cache, shared.prompt_len, torch.tensor([answer_ids]))
    return Compressor(net, None, OraclePress()).select(scores[None], ids, budget)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=Path, default=Path("experiments/generalise/results/dev_mix"))
    parser.add_argument("--method", default="lookaheadkv")
    parser.add_argument("--adapter", default="experiments/generalise/adapters/mix_s0")
    parser.add_argument("--presets", nargs="+", default=["long", "pooled", "paper"])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--needles", type=int, default=3)
    args = parser.parse_args(argv)
    lost = lost_needles(args.answers, args.method, str(args.budget))
    net, tokenizer, module = load_module(args.adapter)
    defaults = folder_defaults(args.adapter)
    probe = ProbePress.from_folder(Path(args.adapter) / "probe", net) if defaults.probe else None
    compressors = {}
    for preset in args.presets:
        settings = defaults.settings({"preset": preset})
        press = lookahead_press(module, probe if settings.needs_probe else None, settings, tokenizer)
        compressors[preset] = Compressor(net, tokenizer, press)
    task = GeneraliseTask(
        sources=tuple(sorted({r["meta"]["source"] for r, _ in lost.values()})),
        split="dev",
        samples_per_source=8,
        oversample=3,
        screened_by=str(args.answers.parent / "screen"),
    )
    samples = [s for s in task.samples(tokenizer) if s.id in lost][: args.needles]
    print(
        f"Share of (layer, KV head)s keeping each token at C = {args.budget}, {args.method} ({args.adapter}).\n"
    )
    for sample in samples:
        context, question = encode_sample(sample, tokenizer)
        value = value_positions(sample, tokenizer)
        shown = range(max(0, value[0] - BEFORE), value[-1] + 1 + AFTER)
        words = [tokenizer.decode([context[i]]).replace("\n", "⏎").replace("|", "/") for i in shown]
        row, answer_ids = lost[sample.id]
        answer = row["prediction"].replace("\n", " ")[:80]
        print(f"**{sample.id}** ({sample.meta['kind']}, {sample.meta['distance']} tokens from the end): "
              f"value `{sample.answers[0]}`, answered `{answer}`\n")  # fmt: skip
        header = [f"`{w}`" + ("*" if i in value else "") for i, w in zip(shown, words, strict=True)]
        print("| preset | " + " | ".join(header) + " |")
        print("|---" * (len(words) + 1) + "|")
        kept = {p: c.evict(c.score(context + question), args.budget).kept for p, c in compressors.items()}
        kept["Oracle"] = oracle_kept(net, torch.tensor([context + question]), answer_ids, args.budget)
        for name, sets in kept.items():
            print(f"| {name} | " + " | ".join(f"{100 * v:.0f}" for v in kept_profile(sets, shown)) + " |")
        print("\n(* the value's tokens; cells: % of (layer, KV head)s)\n")


if __name__ == "__main__":
    main()
