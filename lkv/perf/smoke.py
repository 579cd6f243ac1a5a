"""Helpers of ``scripts/smoke_gpu.sh``: the paper-scale pipeline on one GPU with no hub and no real weights.

``python -m lkv.perf.smoke SUBCOMMAND``:

``assets --out DIR --arch llama-3.1-8b --dtype bfloat16 --device cuda --train-lengths ... --heldout-lengths ...``
    a randomly initialised model of a real architecture (:data:`lkv.perf.models.ARCHITECTURES`) saved as a
    Hugging Face folder ``DIR/model`` with a tokenizer built in code (byte-level BPE, Llama-3-style chat
    template), and prompt files ``DIR/prompts-{train,heldout}.jsonl`` of pseudo-words, one prompt per
    requested length in tokens (the rendered prompt, chat template included, is that long to within a few
    tokens).
``summary --out DIR``
    ``DIR/summary.md`` and ``summary.json`` from the stages, the step times and the TTFT benchmark.

Each stage runs under ``scripts/smoke_stage.py`` (the ``lkv`` entry point in-process, then
:func:`record_stage`: CUDA's ``max_memory_allocated`` when a GPU was used, else the process's peak resident
set, ``ru_maxrss``, which includes the interpreter and everything loaded).

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
from pathlib import Path
from typing import Any

import lightning as L
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from lkv.core.clock import clock
from lkv.perf.models import architecture_config

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3's chat format (the header tokens around each role, <|eot_id|> closing each turn)
CHAT_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
TOKENIZER_VOCAB = 2048
STAGES_FILE = "stages.jsonl"
STEP_TIMES_FILE = "step_times.json"
GIB = 2**30


def pseudo_words(count: int, seed: int = 0) -> list[str]:
    """``count`` pronounceable pseudo-words of 1–4 syllables (seeded)."""
    rng = random.Random(seed)
    onsets, vowels, codas = "bcdfghjklmnprstvwz", "aeiou", ["", "n", "r", "s", "t", "l"]
    return [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        for _ in range(count)
    ]


def build_tokenizer(vocab_size: int = TOKENIZER_VOCAB, seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text round-trips) trained on pseudo-words, with Llama 3's chat format.

    ``vocab_size`` (≥ 260: 256 bytes and the special tokens) must not exceed the model's vocabulary.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = pseudo_words(5000, seed)
    backend.train_from_iterator([" ".join(words[i : i + 50]) for i in range(0, len(words), 50)], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|eot_id|>",
        chat_template=CHAT_TEMPLATE,
    )


def save_model(folder: Path, architecture: str, dtype: str, device: str, seed: int = 0) -> None:
    """A random model of ``architecture`` and :func:`build_tokenizer` saved to ``folder`` (weights in ``dtype``)."""
    from lkv.model.backbone import DTYPES

    config = architecture_config(architecture)
    tokenizer = build_tokenizer(min(TOKENIZER_VOCAB, config.vocab_size), seed)
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
    overhead = len(
        tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True)
    )
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


def summarise(out: Path) -> dict[str, Any]:
    """``out/summary.{json,md}``: peak memory and seconds per stage, s/step, TTFT overhead per method."""
    stages = [json.loads(line) for line in (out / STAGES_FILE).read_text().splitlines() if line.strip()]
    summary: dict[str, Any] = {"stages": stages}
    lines = ["| stage | seconds | peak GiB | measured as |", "|---|---|---|---|"]
    lines += [
        f"| {s['stage']} | {s['seconds']:.1f} | {s['peak_bytes'] / GIB:.2f} | {s['peak_kind']} |"
        for s in stages
    ]
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lkv.perf.smoke", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    assets = sub.add_parser("assets")
    assets.add_argument("--out", type=Path, required=True)
    assets.add_argument("--arch", default="llama-3.1-8b")
    assets.add_argument("--dtype", default="bfloat16")
    assets.add_argument("--device", default="cuda")
    assets.add_argument("--train-lengths", type=int, nargs="+", required=True)
    assets.add_argument("--heldout-lengths", type=int, nargs="+", required=True)
    summary = sub.add_parser("summary")
    summary.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "assets":
        args.out.mkdir(parents=True, exist_ok=True)
        save_model(args.out / "model", args.arch, args.dtype, args.device)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out / "model")
        write_prompts(args.out / "prompts-train.jsonl", tokenizer, args.train_lengths, seed=1)
        write_prompts(args.out / "prompts-heldout.jsonl", tokenizer, args.heldout_lengths, seed=2)
    else:
        summarise(args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
