"""Helpers of ``scripts/smoke_gpu.sh``: the paper-scale pipeline on one GPU with no hub and no real weights.

``python -m lkv.perf.smoke SUBCOMMAND`` (each also runs as a timed stage under ``scripts/smoke_stage.py``):

``model --out DIR --arch llama-3.1-8b --chat llama3 --dtype bfloat16 --device cuda``
    a randomly initialised model of a real architecture (:data:`lkv.perf.models.ARCHITECTURES`) saved as a
    Hugging Face folder with a tokenizer built in code (byte-level BPE) and the chat format ``--chat``:
    Llama 3's, or Qwen3's, whose template reads ``enable_thinking`` (thinking off: an empty think block).
``prompts --model DIR --out FILE.jsonl --lengths ... --seed N``
    one JSONL prompt per length, of pseudo-words, whose chat-rendered token count (as ``lkv label``
    renders it, thinking off) is that length to within a few tokens.
``essays --model DIR --out DIR --docs N --tokens N``
    ``N`` pseudo-word essays of about ``--tokens`` tokens each, in sentences: the needle task's haystacks.
``summary --out DIR [--thinking-labels DIR ...]``
    ``DIR/summary.md`` and ``summary.json`` from the stages, the step times and the TTFT benchmark, and the
    checks (:func:`checks`): every stage's wall time, and that Qwen3 labels end with the empty think block
    and that no ``lkv eval`` stage held more K/V than its bound (docs/scale_out.md, "Evaluation memory").

Each stage runs under ``scripts/smoke_stage.py`` (in-process, then :func:`record_stage`: CUDA's
``max_memory_allocated`` when a GPU was used, else the process's peak resident set, ``ru_maxrss``, which
includes the interpreter and everything loaded).

:class:`StepTimes` is the Lightning callback the smoke overlay adds to ``lkv fit``: seconds per optimiser
step on the synchronised clock, written to a JSON file when training ends.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from lkv.core.cache import token_bytes
from lkv.core.chat import render_chat
from lkv.core.clock import clock
from lkv.labels.shards import load_labels
from lkv.perf.models import architecture_config


@dataclass(frozen=True)
class ChatFormat:
    """A chat format the smoke tokenizer is built with: special tokens, their roles and the template."""

    special_tokens: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str
    template: str


CHATS = {
    # Llama 3's format (the header tokens around each role, <|eot_id|> closing each turn)
    "llama3": ChatFormat(
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
        "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    ),
    # Qwen3's ChatML, with the generation prompt of its template: thinking off opens an empty think block
    "qwen3": ChatFormat(
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        None,
        "<|im_end|>",
        "<|endoftext|>",
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- endif %}{%- endif %}",
    ),
}
EMPTY_THINK = "<think>\n\n</think>\n\n"
TOKENIZER_VOCAB = 2048
STAGES_FILE = "stages.jsonl"
STEP_TIMES_FILE = "step_times.json"
GIB = 2**30
# Room an `lkv eval` stage may take besides its weights and B + 2 full caches: the prefill's activations
# (≈ 1.3 GiB of MLP intermediates at 16K on Llama-3.1-8B), the teacher-forced importance pass, the
# compressed caches being decoded and the allocator's rounding. The bound is B + 1 caches (one spare).
EVAL_SLACK_BYTES = 4 * GIB


def pseudo_words(count: int, seed: int = 0) -> list[str]:
    """``count`` pronounceable pseudo-words of 1–4 syllables (seeded)."""
    rng = random.Random(seed)
    onsets, vowels, codas = "bcdfghjklmnprstvwz", "aeiou", ["", "n", "r", "s", "t", "l"]
    return [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        for _ in range(count)
    ]


def build_tokenizer(
    vocab_size: int = TOKENIZER_VOCAB, seed: int = 0, chat: str = "llama3"
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text round-trips) trained on pseudo-words, with the chat format ``chat``
    (:data:`CHATS`).

    ``vocab_size`` (≥ 256 bytes + the special tokens) must not exceed the model's vocabulary.
    """
    if chat not in CHATS:
        raise ValueError(f"chat must be one of {', '.join(CHATS)}, got {chat!r}")
    form = CHATS[chat]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(form.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = pseudo_words(5000, seed)
    backend.train_from_iterator([" ".join(words[i : i + 50]) for i in range(0, len(words), 50)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=form.bos,
        eos_token=form.eos,
        pad_token=form.pad,
        chat_template=form.template,
    )


def save_model(
    folder: Path, architecture: str, dtype: str, device: str, chat: str = "llama3", seed: int = 0
) -> None:
    """A random model of ``architecture`` and :func:`build_tokenizer` saved to ``folder`` (weights in ``dtype``)."""
    from lkv.model.backbone import DTYPES

    config = architecture_config(architecture)
    tokenizer = build_tokenizer(min(TOKENIZER_VOCAB, config.vocab_size), seed, chat)
    config.eos_token_id = tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id
    torch.manual_seed(seed)
    with torch.device(device):  # built where it runs: an 8B model initialises in seconds on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def write_prompts(path: Path, tokenizer: PreTrainedTokenizerFast, lengths: list[int], seed: int) -> None:
    """One JSONL prompt per length: pseudo-word text whose chat-rendered token count is about that length."""
    words = pseudo_words(2000, seed + 1)
    rng = random.Random(seed)
    empty = render_chat(tokenizer, [{"role": "user", "content": ""}])  # as `lkv label` renders (thinking off)
    overhead = len(tokenizer(empty, add_special_tokens=False)["input_ids"])
    with path.open("w", encoding="utf-8") as out:
        for index, length in enumerate(lengths):
            if length <= overhead:
                raise ValueError(f"prompt length {length}: must exceed the chat template's {overhead} tokens")
            text = ""
            ids: list[int] = []
            while len(ids) < length - overhead:  # ~2 tokens a word: grow in blocks, then cut to the length
                text += " ".join(rng.choice(words) for _ in range(length)) + " "
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            content = tokenizer.decode(ids[: length - overhead])
            out.write(json.dumps({"id": f"{path.stem}-{index}", "prompt": content}) + "\n")


def write_essays(
    folder: Path, tokenizer: PreTrainedTokenizerFast, docs: int, tokens: int, seed: int = 3
) -> None:
    """``docs`` essays of pseudo-word sentences, about ``tokens`` tokens each (``folder/essay-<i>.txt``)."""
    words = pseudo_words(3000, seed)
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(docs):
        sentences: list[str] = []
        count = 0
        while count < tokens:
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."
            sentences.append(sentence)
            count += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
        (folder / f"essay-{index}.txt").write_text(" ".join(sentences) + "\n", encoding="utf-8")


def peak_memory() -> tuple[int, str]:
    """``(bytes, kind)``: CUDA's allocated peak when a GPU is in use, else this process's peak resident set."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"  # Linux reports kB


def record_stage(name: str, out: Path, args: list[str], seconds: float) -> dict[str, Any]:
    """Append a finished stage's seconds and this process's peak memory to ``out/stages.jsonl``."""
    peak, kind = peak_memory()
    record = {"stage": name, "seconds": seconds, "peak_bytes": peak, "peak_kind": kind, "command": args}
    with (out / STAGES_FILE).open("a", encoding="utf-8") as stages:
        stages.write(json.dumps(record) + "\n")
    print(f"smoke: {name} took {seconds:.1f} s, peak {peak / GIB:.2f} GiB ({kind})", flush=True)
    return record


class StepTimes(L.Callback):
    """Seconds of every optimiser step (synchronised clock), written to ``path`` as JSON when training ends.

    A step spans its micro-batches (``accumulate_grad_batches``), from the first one's start to the
    optimiser's update; validation and checkpointing between steps are not counted.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.seconds: list[float] = []
        self._start: float | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx
    ) -> None:
        if self._start is None:
            self._start = clock(pl_module.device)

    def on_before_zero_grad(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # called once per optimiser step, right after the update
        if self._start is not None:
            self.seconds.append(clock(pl_module.device) - self._start)
            self._start = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            previous = json.loads(self.path.read_text()) if self.path.is_file() else []
            self.path.write_text(json.dumps(previous + [self.seconds]))


def summarise(out: Path, thinking_labels: list[Path] | None = None) -> dict[str, Any]:
    """``out/summary.{json,md}``: seconds and peak memory per stage, s/step, TTFT overhead per method, and the
    :func:`checks`; returns the summary (its ``failed`` lists the checks that failed)."""
    stages = [json.loads(line) for line in (out / STAGES_FILE).read_text().splitlines() if line.strip()]
    summary: dict[str, Any] = {"stages": stages, "total_seconds": sum(s["seconds"] for s in stages)}
    lines = ["| stage | seconds | peak GiB | measured as |", "|---|---|---|---|"]
    lines += [
        f"| {s['stage']} | {s['seconds']:.1f} | {s['peak_bytes'] / GIB:.2f} | {s['peak_kind']} |"
        for s in stages
    ]
    lines.append(f"| **all stages** | {summary['total_seconds']:.1f} | | |")
    steps_file = out / STEP_TIMES_FILE
    if steps_file.is_file():
        runs = json.loads(steps_file.read_text())
        # the first step of each run pays for warm-up (kernel selection, allocator growth)
        steady = [s for run in runs for s in run[1:]]
        summary["step_seconds"] = runs
        summary["median_s_per_step"] = statistics.median(steady) if steady else None
        if steady:
            lines.append(
                f"\nfit: {summary['median_s_per_step']:.2f} s per optimiser step (median, first steps excluded)"
            )
    bench_file = out / "ttft.json"
    if bench_file.is_file():
        ttft = json.loads(bench_file.read_text())["benchmarks"]["ttft"]
        summary["ttft"] = ttft["derived"]
        lines += [
            "",
            "| S | method | TTFT overhead ms | overhead % | eviction stage % |",
            "|---|---|---|---|---|",
        ]
        for length, methods in ttft["derived"].items():
            for method, d in methods.items():
                lines.append(
                    f"| {length} | {method} | {1e3 * d['overhead_s']:.1f} | {d['overhead_pct']:.2f} | "
                    f"{d['eviction_pct']:.2f} |"
                )
    summary["checks"] = checks(stages, thinking_labels or [])
    summary["failed"] = [c["check"] for c in summary["checks"] if c["ok"] is False]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    lines += [
        f"| {c['check']} | {'skipped' if c['ok'] is None else 'ok' if c['ok'] else 'FAILED'} | {c['detail']} |"
        for c in summary["checks"]
    ]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return summary


def checks(stages: list[dict[str, Any]], thinking_labels: list[Path]) -> list[dict[str, Any]]:
    """What the smoke run must show besides finishing: ``{"check", "ok", "detail"}`` each (``ok`` None: not
    applicable here).

    - ``thinking off``: every row of each folder in ``thinking_labels`` (labelled with a Qwen3-style template)
      ends with the empty think block, so its responses are answers, not reasoning;
    - ``eval memory``: each ``lkv eval`` stage on a GPU peaked below its weights + (B + 2) full caches of its
      longest prompt and answer + :data:`EVAL_SLACK_BYTES` (the bound is B + 1: docs/scale_out.md); the
      earlier eval held about 3 · B.
    """
    out = []
    for folder in thinking_labels:
        meta = json.loads((folder / "meta.json").read_text())
        tokenizer = PreTrainedTokenizerFast.from_pretrained(meta["model"]["name"])
        think = tokenizer(EMPTY_THINK, add_special_tokens=False)["input_ids"]
        rows = list(load_labels(folder))
        ended = sum(list(row["prompt_ids"][-len(think) :]) == think for row in rows)
        out.append(
            {
                "check": f"thinking off ({folder.name})",
                "ok": ended == len(rows) > 0,
                "detail": f"{ended} of {len(rows)} prompts end with the empty think block; "
                f"chat_template_kwargs {meta['extra'].get('chat_template_kwargs')}",
            }
        )
    for stage in stages:
        if stage["command"][:1] == ["eval"]:
            out.append(_eval_memory(stage))
    return out


def _eval_memory(stage: dict[str, Any]) -> dict[str, Any]:
    name = f"eval memory ({stage['stage']})"
    if stage["peak_kind"] != "cuda_max_memory_allocated":
        return {"check": name, "ok": None, "detail": "no GPU: the process's resident set is not K/V memory"}
    args = stage["command"]
    option = {key: value for key, value in zip(args, args[1:], strict=False) if key.startswith("--")}
    model = Path(option["--model"])
    rows = [
        json.loads(line) for line in (Path(option["--output"]) / "results.jsonl").read_text().splitlines()
    ]
    entries = max(row["prompt_tokens"] + len(row.get("answer_ids", [])) for row in rows)
    batch = int(option.get("--batch_size", 8))
    dtype_bytes = torch.finfo(getattr(torch, option.get("--dtype", "float32"))).bits // 8
    cache = entries * token_bytes(AutoConfig.from_pretrained(model).get_text_config(), dtype_bytes)
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    bound = weights + (batch + 2) * cache + EVAL_SLACK_BYTES
    return {
        "check": name,
        "ok": stage["peak_bytes"] <= bound,
        "detail": f"peak {stage['peak_bytes'] / GIB:.2f} GiB ≤ weights {weights / GIB:.2f} + {batch + 2} × "
        f"{cache / GIB:.2f} GiB caches ({entries} tokens) + {EVAL_SLACK_BYTES / GIB:.0f} GiB = {bound / GIB:.2f} GiB",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lkv.perf.smoke", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model")
    model.add_argument("--out", type=Path, required=True)
    model.add_argument("--arch", default="llama-3.1-8b")
    model.add_argument("--chat", default="llama3", choices=sorted(CHATS))
    model.add_argument("--dtype", default="bfloat16")
    model.add_argument("--device", default="cuda")
    prompts = sub.add_parser("prompts")
    prompts.add_argument("--model", type=Path, required=True)
    prompts.add_argument("--out", type=Path, required=True)
    prompts.add_argument("--lengths", type=int, nargs="+", required=True)
    prompts.add_argument("--seed", type=int, default=1)
    essays = sub.add_parser("essays")
    essays.add_argument("--model", type=Path, required=True)
    essays.add_argument("--out", type=Path, required=True)
    essays.add_argument("--docs", type=int, default=4)
    essays.add_argument("--tokens", type=int, required=True)
    summary = sub.add_parser("summary")
    summary.add_argument("--out", type=Path, required=True)
    summary.add_argument("--thinking-labels", type=Path, nargs="*", default=[])
    args = parser.parse_args(argv)
    if args.command == "model":
        save_model(args.out, args.arch, args.dtype, args.device, args.chat)
    elif args.command == "prompts":
        write_prompts(args.out, PreTrainedTokenizerFast.from_pretrained(args.model), args.lengths, args.seed)
    elif args.command == "essays":
        write_essays(args.out, PreTrainedTokenizerFast.from_pretrained(args.model), args.docs, args.tokens)
    else:
        failed = summarise(args.out, args.thinking_labels)["failed"]
        if failed:
            sys.exit(f"smoke: checks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
