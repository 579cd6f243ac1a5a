"""Why Expected Attention keeps no needle on SmolLM2-135M: its per-token scores on FullKV-solved needle prompts
beside the Oracle's, with each of its parts changed in turn (prefill only, nothing decoded).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python experiments/expected_attention/diagnose.py [--per-cell 2]
        [--out FOLDER] [--table-only]

The prompts are the committed full evaluation's (experiments/full_evidence): its ``needle_id`` task rebuilt with
the config's settings (in-distribution fact formats, 1K and 3K tokens, seed 0), the first ``--per-cell``
FullKV-solved samples (question-aware rows) of each (length, depth) cell for depths 0.1/0.3/0.7/0.9; a rebuilt
prompt must have its committed row's length. Each prompt is prefilled once together with the committed FullKV
answer (teacher-forced), keeping every layer's attention input; the Oracle is that answer's attention on the
prompt (:func:`lkv.core.importance.response_importance`, as ``lkv eval`` scores it). Every Expected Attention
variant is lkv's own press or its scoring function, fed query statistics
(:class:`~lkv.eviction.presses.expected_attention.QueryStatistics`) from a chosen window of those inputs:

- ``kvpress``: the press as registered (kvpress's defaults: queries of the whole prompt after 4 sinks, RoPE
  averaged over 512 future positions, covariance term, value norm, epsilon 0);
- ``agnostic``: the same on the context alone (the question appended after eviction), against the Oracle of
  the question-agnostic row (the answer's attention after the appended question);
- ``no_vnorm``, ``no_cov``, ``vnorm_only`` (``‖v‖``: the limit of a large epsilon), ``next_position``
  (``n_future_positions=1``: no rotation average), ``cov_x4`` (the covariance term four times as large),
  ``group_max`` (the largest of a KV group's 3 query heads instead of their mean);
- ``question``: statistics of the question's queries only; ``answer``: of the FullKV answer's queries, the
  future queries themselves, rotation averaged over the answer's positions — what a perfect estimate of the
  Gaussian gives; ``answer_mean`` / ``answer_cov``: the answer's mean with the prompt's covariance, and the
  prompt's mean with the answer's covariance (which of the two statistics carries the needle).

The ``kvpress`` variant is checked against the registered press scored through lkv's evaluation path
(``Compressor.score``, its own prefill and capture): equal to 1e-4.

Per variant and prompt, over the 30 layers × 3 KV heads: the value tokens' best rank (1 = top; median over
heads), the share of value tokens in the top C = 128 / 256 (sinks first, as the press keeps them) and of heads
holding the whole value, the share kept at half the prompt (compression ratio 0.5), the share kept at C = 128
in the heads that read the needle (those whose Oracle top-128 holds the whole value), the value tokens' score
percentile per third of the layers, Spearman's ρ against the Oracle (sinks left out), and where the top-128 sit (sink, chat template, needle sentence, question, the 128
context tokens before it, punctuation/newline tokens, other). For the press itself also its parts: the spread
(std over keys) of the mean-query logit and of the covariance logit, the expected attention's effective support
(exp of its entropy, in tokens), the share of the mean query's norm that the rotation average keeps, SmolLM2's
RoPE frequency pairs that keep at least half their amplitude in it, and the cosine of the prompt's (and the
question's) mean query with the answer's, per head. Writes ``FOLDER/diagnose.jsonl`` (one row per prompt and
variant) and ``FOLDER/diagnose.md`` (means; ``--table-only`` rewrites it from the jsonl).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
from functools import partial
from operator import itemgetter
from pathlib import Path

import torch

from experiments.competitor_diagnosis.why import needle_span
from lkv.core.attention import HiddenCapture
from lkv.core.chat import chat_parts
from lkv.core.generation import crop_to, prefill
from lkv.core.importance import response_importance
from lkv.eval.tasks import NeedleFamilyTask, encode_sample
from lkv.eval.tasks.needle_tokens import value_positions
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import PressContext
from lkv.eviction.presses.expected_attention import (
    ExpectedAttentionPress,
    QueryStatistics,
    average_rotation,
    expected_attention_scores,
)
from lkv.model.backbone import load_backbone

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "experiments/full_evidence/results/results.jsonl"
# experiments/full_evidence/configs/full_evidence.yaml, its needle_id task
TASK = {
    "distribution": "in",
    "lengths": (1024, 3072),
    "depths": (0.1, 0.3, 0.5, 0.7, 0.9),
    "samples_per_cell": 2,
}
DEPTHS = (0.1, 0.3, 0.7, 0.9)
BUDGETS = (128, 256)
RECENT = 128
N_SINK = ExpectedAttentionPress().n_sink
# the press's own settings changed one at a time
CHANGED = {
    "no_vnorm": {"use_vnorm": False},
    "no_cov": {"use_covariance": False},
    "next_position": {"n_future_positions": 1},
}


def solved_samples(per_cell: int) -> dict[str, tuple[list[int], int]]:
    """Sample id → (committed FullKV answer ids, prompt tokens), for the first ``per_cell`` FullKV-solved
    question-aware ``needle_id`` rows of each (length, depth) cell (depths :data:`DEPTHS`), in the file's order."""
    chosen: dict[str, tuple[list[int], int]] = {}
    taken: dict[tuple[int, float], int] = {}
    for line in ROWS.read_text().splitlines():
        row = json.loads(line)
        if (row["task"], row["method"], row["setting"], row["score"]) != (
            "needle_id",
            "fullkv",
            "aware",
            1.0,
        ):
            continue
        cell = (row["meta"]["length"], row["meta"]["depth"])
        if cell[1] in DEPTHS and taken.get(cell, 0) < per_cell:
            taken[cell] = taken.get(cell, 0) + 1
            chosen[row["sample"]] = row["answer_ids"], row["prompt_tokens"]
    return chosen


def ranks(scores: torch.Tensor) -> torch.Tensor:
    """``(..., S)`` → the rank of each score in its row, 1 = the highest (ties in index order)."""
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return order.argsort(dim=-1).float() + 1


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise Spearman ρ of ``(..., S)`` score tensors (no ties expected in continuous scores)."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return (ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))


def statistics_of(model, hidden: dict[int, torch.Tensor], end: int, window: int) -> QueryStatistics:
    """lkv's query statistics of every layer over positions ``[end - window, end)`` of the captured inputs."""
    stats = QueryStatistics(num_keys=end, last_queries=window)
    for layer, states in hidden.items():
        stats.observe_input(model.model.layers[layer].self_attn, states[:, :end])
    return stats


class MixedStatistics(QueryStatistics):
    """The mean of one window's query statistics with the covariance of another's, times ``factor``."""

    def __init__(self, means: QueryStatistics, covariances: QueryStatistics, factor: float = 1.0) -> None:
        super().__init__(means.num_keys, means.last_queries)
        self.means, self.covariances, self.factor = means, covariances, factor

    def take(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.means.take(layer_idx)[0], self.covariances.take(layer_idx)[1] * self.factor


def press_scores(model, press, ids, cache, stats) -> torch.Tensor:
    """``(layers, kv_heads, S)`` scores of ``press`` on prompt ``ids`` from ``stats`` (``+inf`` on sinks)."""
    return press.score(PressContext(model, ids, cache, torch.zeros(1), stats))[0]


def rotation_for(model, start: int, count: int) -> torch.Tensor:
    """``R̄``, RoPE's rotation averaged over positions ``[start, start + count)``."""
    positions = torch.arange(start, start + count)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1), position_ids=positions)
    return average_rotation(cos[0], sin[0])


def per_head_probs(model, stats, cache, rotation, use_covariance: bool) -> torch.Tensor:
    """``(layers, heads, S - n_sink)`` expected attention of each query head (no value norm, no group mean):
    the scoring function given each query head its own copy of its KV head's keys."""
    out = []
    for layer_idx, layer in enumerate(cache.layers):
        mean, covariance = stats.take(layer_idx)
        group = mean.shape[1] // layer.keys.shape[1]
        keys = layer.keys[:, :, N_SINK:].repeat_interleave(group, dim=1)
        out.append(
            expected_attention_scores(
                mean, covariance, keys, keys, rotation, use_covariance, use_vnorm=False
            )[0]
        )
    return torch.stack(out)


def categories(
    ids: list[int], context_len: int, prefix_len: int, sentence: list[int], tokenizer
) -> torch.Tensor:
    """Each prompt position's place, as an index into :data:`PLACES`."""
    place = torch.full((len(ids),), PLACES.index("other"))
    words = tokenizer.convert_ids_to_tokens(ids)
    for i, word in enumerate(words):
        text = tokenizer.convert_tokens_to_string([word]).strip()
        if not any(ch.isalnum() for ch in text):
            place[i] = PLACES.index("punct/newline")
    place[context_len - RECENT : context_len] = PLACES.index("recent")
    place[sentence] = PLACES.index("needle sentence")
    place[context_len:] = PLACES.index("question")
    place[:prefix_len] = PLACES.index("template")
    place[:N_SINK] = PLACES.index("sink")
    return place


PLACES = ("sink", "template", "needle sentence", "question", "recent", "punct/newline", "other")


def measures(scores: torch.Tensor, oracle: torch.Tensor, values: list[int], place: torch.Tensor) -> dict:
    """The per-variant measures of the module docstring, ``scores``/``oracle`` ``(layers, kv_heads, S)``."""
    finite = torch.nan_to_num(scores.float(), posinf=torch.finfo(torch.float32).max)
    rank = ranks(finite)
    value_rank = rank[..., values]
    percentile = 100 * (1 - (value_rank - 1) / (scores.shape[-1] - 1))
    top = rank <= BUDGETS[0]
    # the heads that read the needle: those whose Oracle top-128 holds the whole value
    reading = (ranks(oracle.float())[..., values] <= BUDGETS[0]).all(-1)
    out = {
        "value_best_rank": value_rank.min(-1).values.median().item(),
        "value_mean_pct": percentile.mean().item(),
        "value_pct_by_third": [third.mean().item() for third in percentile.mean(-1).chunk(3)],
        "rho_oracle": spearman(finite[..., N_SINK:], oracle[..., N_SINK:].float()).mean().item(),
        "value_kept_half": (value_rank <= scores.shape[-1] // 2).float().mean().item(),
        "value_kept_128_reading_heads": (value_rank[reading] <= BUDGETS[0]).float().mean().item(),
        "where_top128": {
            p: (top & (place == i)).sum(-1).float().mean().item() / BUDGETS[0] for i, p in enumerate(PLACES)
        },
    }
    for c in BUDGETS:
        kept = value_rank <= c
        out[f"value_kept_{c}"] = kept.float().mean().item()
        out[f"heads_all_{c}"] = kept.all(-1).float().mean().item()
    return out


def parts(model, hidden, cache, prompt_len: int, question_len: int, answer_len: int) -> dict:
    """The press's components on one prompt (see the module docstring)."""
    window = prompt_len - N_SINK
    rotation = rotation_for(model, prompt_len, ExpectedAttentionPress().n_future_positions)
    full = per_head_probs(model, statistics_of(model, hidden, prompt_len, window), cache, rotation, True)
    mean_only = per_head_probs(
        model, statistics_of(model, hidden, prompt_len, window), cache, rotation, False
    )
    tiny = torch.finfo(torch.float32).tiny
    log_full, log_mean = full.clamp_min(tiny).log(), mean_only.clamp_min(tiny).log()
    # softmax logits up to a constant per head: log p(mean only) is the mean term, the difference the covariance's
    mean_spread = log_mean.std(-1).mean().item()
    cov_spread = (log_full - log_mean).std(-1).mean().item()
    entropy = -(full * full.clamp_min(tiny).log()).sum(-1)
    stats = statistics_of(model, hidden, prompt_len, window)
    asked = statistics_of(model, hidden, prompt_len, question_len)
    answered = statistics_of(model, hidden, prompt_len + answer_len, answer_len)
    kept_norm, to_answer, question_to_answer = [], [], []
    for layer in range(len(cache.layers)):
        mean, answer_mean = stats.take(layer)[0], answered.take(layer)[0]
        kept_norm.append(((mean @ rotation.T).norm(dim=-1) / mean.norm(dim=-1)).mean().item())
        to_answer.append(torch.cosine_similarity(mean, answer_mean, dim=-1).mean().item())
        question_to_answer.append(
            torch.cosine_similarity(asked.take(layer)[0], answer_mean, dim=-1).mean().item()
        )
    return {
        "mean_logit_std": mean_spread,
        "cov_logit_std": cov_spread,
        "support_tokens": entropy.exp().mean().item(),
        "support_tokens_no_cov": (-(mean_only * mean_only.clamp_min(tiny).log()).sum(-1)).exp().mean().item(),
        "rotation_keeps_mean_norm": statistics.mean(kept_norm),
        "cos_prompt_answer_mean": statistics.mean(to_answer),
        "cos_question_answer_mean": statistics.mean(question_to_answer),
        "rope_pairs_kept": frequencies_kept(model, prompt_len, ExpectedAttentionPress().n_future_positions),
        "rope_theta": model.config.rope_parameters["rope_theta"],
        "head_dim": model.config.head_dim,
    }


def frequencies_kept(model, start: int, count: int) -> int:
    """How many of RoPE's frequency pairs keep at least half their amplitude in ``R̄`` (positions ``[start,
    start + count)``): ``|mean cos|`` and ``|mean sin|`` of a pair combine to that amplitude."""
    rotation = rotation_for(model, start, count)
    half = rotation.shape[0] // 2
    amplitude = torch.stack([rotation.diagonal()[:half], rotation.diagonal(half)[:half]], -1).norm(dim=-1)
    return int((amplitude >= 0.5).sum())


@torch.no_grad()
def diagnose(model, tokenizer, sample, answer: list[int], prompt_tokens: int) -> list[dict]:
    """Every variant's measures on one needle prompt (one row each); ``prompt_tokens`` is the committed row's
    prompt length, which the rebuilt prompt must match."""
    context, question = encode_sample(sample, tokenizer)
    ids = context + question
    if len(ids) != prompt_tokens:
        raise RuntimeError(
            f"{sample.id}: rebuilt prompt has {len(ids)} tokens, the committed row {prompt_tokens}"
        )
    prompt_len, context_len = len(ids), len(context)
    capture = HiddenCapture()
    cache, _ = prefill(model, torch.tensor([ids + answer]), lkv_capture=capture)
    hidden = {layer: capture.take(layer) for layer in capture.layers}
    crop_to(cache, prompt_len)
    prompt = torch.tensor([ids])
    oracle = response_importance(model, cache, prompt_len, torch.tensor([answer]))
    context_cache = copy.deepcopy(cache)
    crop_to(context_cache, context_len)
    oracle_agnostic = response_importance(
        model, context_cache, context_len, torch.tensor([question + answer]), last_queries=len(answer)
    )
    values = value_positions(sample, tokenizer)
    sentence = needle_span(sample, tokenizer)
    prefix_len = len(tokenizer(chat_parts(tokenizer)[0], add_special_tokens=False)["input_ids"])
    place = categories(ids, context_len, prefix_len, sentence, tokenizer)

    press = ExpectedAttentionPress()
    whole_stats = partial(statistics_of, model, hidden, prompt_len, prompt_len - N_SINK)
    variants = {"kvpress": press_scores(model, press, prompt, cache, whole_stats())}
    for name, settings in CHANGED.items():
        variants[name] = press_scores(model, ExpectedAttentionPress(**settings), prompt, cache, whole_stats())
    variants["vnorm_only"] = torch.stack([layer.values[0].float().norm(dim=-1) for layer in cache.layers])
    variants["cov_x4"] = press_scores(
        model, press, prompt, cache, MixedStatistics(whole_stats(), whole_stats(), 4.0)
    )
    variants["question"] = press_scores(
        model, press, prompt, cache, statistics_of(model, hidden, prompt_len, len(question))
    )
    rotation = rotation_for(model, prompt_len, ExpectedAttentionPress().n_future_positions)
    heads = per_head_probs(model, whole_stats(), cache, rotation, True)
    vnorm = variants["vnorm_only"][..., N_SINK:]
    grouped = heads.view(heads.shape[0], vnorm.shape[1], -1, heads.shape[-1]).amax(dim=2) * vnorm
    variants["group_max"] = torch.cat([torch.full_like(grouped[..., :N_SINK], math.inf), grouped], -1)
    answer_stats = partial(statistics_of, model, hidden, prompt_len + len(answer), len(answer))
    variants["answer_mean"] = press_scores(
        model, press, prompt, cache, MixedStatistics(answer_stats(), whole_stats())
    )
    variants["answer_cov"] = press_scores(
        model, press, prompt, cache, MixedStatistics(whole_stats(), answer_stats())
    )
    answered = ExpectedAttentionPress(n_future_positions=len(answer))
    variants["answer"] = press_scores(model, answered, prompt, cache, answer_stats())
    agnostic = press_scores(
        model,
        press,
        torch.tensor([context]),
        context_cache,
        statistics_of(model, hidden, context_len, context_len - N_SINK),
    )

    # the variants' inputs are the press's own: its scores through lkv's evaluation path equal the first variant
    registered = Compressor(model, tokenizer, "expected_attention").score(prompt).scores[0]
    torch.testing.assert_close(registered, variants["kvpress"], rtol=1e-4, atol=1e-6)

    rows = []
    base = {"sample": sample.id, "prompt_tokens": prompt_len, "value_tokens": len(values)}
    for name, scores in variants.items():
        rows.append({**base, "variant": name, **measures(scores, oracle, values, place)})
    rows.append(
        {**base, "variant": "agnostic", **measures(agnostic, oracle_agnostic, values, place[:context_len])}
    )
    rows.append({**base, "variant": "oracle", **measures(oracle, oracle, values, place)})
    rows.append(
        {**base, "variant": "parts", **parts(model, hidden, cache, prompt_len, len(question), len(answer))}
    )
    return rows


COLUMNS = {
    "value rank (best token)": ("value_best_rank", ".0f"),
    "value percentile": ("value_mean_pct", ".0f"),
    "ρ vs Oracle": ("rho_oracle", ".2f"),
    "value kept C=128": ("value_kept_128", ".2f"),
    "value kept C=256": ("value_kept_256", ".2f"),
    "heads with whole value C=128": ("heads_all_128", ".2f"),
    "heads with whole value C=256": ("heads_all_256", ".2f"),
    "value kept, half the prompt": ("value_kept_half", ".2f"),
    "value kept C=128 in the Oracle's reading heads": ("value_kept_128_reading_heads", ".2f"),
}
PARTS = (
    "cos_prompt_answer_mean",
    "cos_question_answer_mean",
    "mean_logit_std",
    "cov_logit_std",
    "support_tokens",
    "support_tokens_no_cov",
    "rotation_keeps_mean_norm",
    "rope_pairs_kept",
)


def table(rows: list[dict], columns: dict[str, tuple[str, str]], head: str) -> list[str]:
    """A markdown table: one line per variant of ``rows``, each column the mean over its rows of a measure."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = [f"| {head} | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        cells = [format(statistics.mean(get(r) for r in mine), spec) for get, spec in columns.values()]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def write_table(rows: list[dict], path: Path) -> None:
    """Means over prompts of each variant's measures, and of the press's parts."""
    scored = [r for r in rows if r["variant"] != "parts"]
    n = len({r["sample"] for r in rows})
    lines = [
        f"n = {n} FullKV-solved needle prompts (experiments/full_evidence, needle_id), 30 layers × 3 KV heads; "
        "means over prompts of the (layer, KV head) means (value rank: median over heads of the best value "
        "token's rank, then the mean over prompts).",
        "",
        *table(scored, {k: (itemgetter(key), spec) for k, (key, spec) in COLUMNS.items()}, "variant"),
        "",
        "Value tokens kept at C = 128 by prompt length (1K: ~1.1K tokens, 3K: ~3.1K):",
        "",
        "| variant | 1K | 3K |",
        "|---|---|---|",
    ]
    for variant in dict.fromkeys(r["variant"] for r in scored):
        by = [
            [
                r["value_kept_128"]
                for r in scored
                if r["variant"] == variant and (r["prompt_tokens"] < 2000) == s
            ]
            for s in (True, False)
        ]
        lines.append(
            f"| {variant} | " + " | ".join(f"{statistics.mean(b):.2f}" if b else "" for b in by) + " |"
        )
    thirds = {
        f"layers {10 * t + 1}–{10 * t + 10}": (lambda r, t=t: r["value_pct_by_third"][t], ".0f")
        for t in range(3)
    }
    places = {p: (lambda r, p=p: r["where_top128"][p], ".2f") for p in PLACES}
    parts = [r for r in rows if r["variant"] == "parts"]
    lines += [
        "",
        "Value tokens' score percentile by layer third (100 = top):",
        "",
        *table(scored, thirds, "variant"),
        "",
        "Where each variant's top 128 sit (share of the 128, mean over heads and prompts):",
        "",
        *table(scored, places, "variant"),
        "",
        f"The press's parts (kvpress defaults; SmolLM2 rope_theta {parts[0]['rope_theta']:g}, "
        f"{parts[0]['head_dim'] // 2} frequency pairs):",
        "",
        *(f"- {key}: {statistics.mean(r[key] for r in parts):.3f}" for key in PARTS),
    ]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--per-cell", type=int, default=2, help="FullKV-solved prompts per (length, depth) cell"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "experiments/expected_attention")
    parser.add_argument(
        "--table-only", action="store_true", help="rewrite diagnose.md from FOLDER/diagnose.jsonl"
    )
    args = parser.parse_args()
    if args.table_only:
        rows = [json.loads(line) for line in (args.out / "diagnose.jsonl").read_text().splitlines()]
        return write_table(rows, args.out / "diagnose.md")
    model, tokenizer = load_backbone()
    answers = solved_samples(args.per_cell)
    task = NeedleFamilyTask(**TASK)
    rows = []
    for sample in task.samples(tokenizer):
        if sample.id in answers:
            answer, prompt_tokens = answers[sample.id]
            rows += diagnose(model, tokenizer, sample, answer, prompt_tokens)
            print(sample.id, flush=True)
    if len({r["sample"] for r in rows}) != len(answers):
        raise RuntimeError(
            f"rebuilt {len({r['sample'] for r in rows})} of {len(answers)} committed samples: "
            "the task settings differ"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "diagnose.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_table(rows, args.out / "diagnose.md")


if __name__ == "__main__":
    main()
