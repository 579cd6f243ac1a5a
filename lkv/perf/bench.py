"""``lkv bench``: side-by-side speed and memory of lkv's hot paths against their baselines.

Sub-benchmarks (``--which``), each measuring all its variants in one process, interleaved, ``repeats`` times
after ``warmup`` rounds (:func:`lkv.core.timing.time_interleaved`), reporting medians and ratios:

``train-step``
    the two-phase step of :mod:`lkv.train.module` (``LookaheadKVModule.training_step`` + backward) vs the naive
    full-sequence forward + backward with a per-token LoRA mask (:mod:`lkv.perf.naive_step`), in two
    variants: ``naive`` (sdpa + lkv's row capture, the strongest naive step) and ``naive-eager`` (the
    guides' eager attention with ``output_attentions``, measured up to ``eager_max_length``): seconds per
    step and peak memory.
``ttft``
    time to first token (prefill + scoring + eviction, :meth:`lkv.eviction.compressor.Compressor.compress`) per
    method; its overhead over a plain prefill (the median of per-round differences, as both ran back to
    back), and the eviction stage alone (scoring + selection + gathering) as a share of the plain prefill —
    short, hence far less noisy than a difference of two prefills. LookaheadKV runs a randomly initialised
    module (timing does not depend on its weights).
``label``
    ground-truth capture (:func:`lkv.labels.labeller.label_prompt`: one prefill, greedy response, one
    teacher-forced pass over the response only) vs ``model.generate`` + one teacher-forced forward over
    prompt + response: seconds and peak memory, whose growth with the prompt length is fitted to a line.
    With ``batch_sizes`` instead: :func:`lkv.labels.batched.label_batch` on the same prompts at each batch
    size (:mod:`lkv.perf.label_batches`): prompts/s, speed-up over batch 1, padding and peak memory.
``decode``
    seconds per decoded token and K/V bytes with the full cache vs a SnapKV-compressed one.
``prefill-memory``
    peak memory and seconds of prefill + eviction (:meth:`~lkv.eviction.compressor.Compressor.compress`) with the
    ``stream_method`` (default LookaheadKV, a randomly initialised module), ``two-phase`` vs layer-``streamed``
    (:mod:`lkv.eviction.streamed`), beside the K/V formula :func:`lkv.eviction.streamed.peak_kv_bytes`.
``train-memory`` (only when named; ``--model random:<architecture>``)
    peak memory of the two-phase step at real shapes without its arithmetic (:mod:`lkv.perf.shape_memory`):
    measured at 1 and 2 decoder layers, projected to the full depth, plus weights and optimiser per GPU.

Peak memory (``train-step``, ``label``, ``prefill-memory``) follows :mod:`lkv.perf.memory`: CUDA allocator statistics on a GPU,
one fresh subprocess per measurement on the CPU. Prompts are seeded random token ids; generations never
stop early (no EOS), so every variant does the same amount of work.
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from lkv.core.cache import cache_bytes
from lkv.core.generation import decode, prefill
from lkv.core.timing import Case, Timings, time_interleaved
from lkv.eviction.presses import LookaheadKVPress, Press
from lkv.eviction.registry import make_method
from lkv.eviction.streamed import peak_kv_bytes
from lkv.perf.memory import cuda_peak_bytes, subprocess_peak_bytes
from lkv.perf.models import load_model
from lkv.perf.timing import linear_fit

DEFAULT_LENGTHS: dict[str, tuple[int, ...]] = {
    "train-step": (1024, 2048, 4096),
    "ttft": (1024, 2048, 4096, 8192),
    "label": (1024, 2048, 4096),
    "decode": (1024, 2048, 4096),
    "prefill-memory": (4096, 8192),
}
BENCHMARKS = tuple(DEFAULT_LENGTHS)
# run only when named (not by --which all): needs --model random:<architecture>
TRAIN_MEMORY = "train-memory"
TRAIN_MEMORY_LENGTHS = (4096, 8192, 16384)
# the variant every other one is compared with
REFERENCE = {
    "train-step": "naive",
    "ttft": "prefill",
    "label": "generate+forward",
    "decode": "full",
    "prefill-memory": "two-phase",
}
BATCH_PREFIX = "batch-"  # label variants at a batch size: batch-1, batch-4, ...
MEASURES_MEMORY = ("train-step", "label", "prefill-memory")
MIB = 2**20


@dataclass
class BenchSettings:
    """What the cases are built from (shared with the memory subprocesses, hence plain JSON values).

    See :func:`bench` for the meaning of each field.
    """

    model: str = "smollm2-135m"
    dtype: str = "float32"
    device: str | None = None
    attn_implementation: str = "sdpa"
    methods: list[str] = field(default_factory=lambda: ["snapkv", "lookaheadkv", "laq", "speckv"])
    budget: int = 256
    window: int = 32
    num_lookahead: int = 32
    lora_rank: int = 8
    draft_tokens: int = 8
    draft_layers: int | None = None
    response_tokens: int = 64
    decode_tokens: int = 32
    eager_max_length: int = 2048
    stream_method: str = "lookaheadkv"
    num_layers: int | None = None
    batch_sizes: list[int] | None = None
    label_prompts: int | None = None
    label_length_spread: float = 0.25
    seed: int = 0

    def reference(self, which: str) -> str:
        """The variant ``which``'s others are compared with."""
        if which == "label" and self.batch_sizes:
            return f"{BATCH_PREFIX}{min(self.batch_sizes)}"
        return REFERENCE[which]

    def variants(self, which: str, length: int | None = None) -> list[str]:
        """Variants of ``which``; with ``length``, those measured at that prompt length."""
        eager = length is None or length <= self.eager_max_length
        return {
            "train-step": ["two-phase", "naive"] + (["naive-eager"] if eager else []),
            "ttft": ["prefill", *self.methods],
            "label": (
                [f"{BATCH_PREFIX}{size}" for size in self.batch_sizes]
                if self.batch_sizes
                else ["label_prompt", "generate+forward"]
            ),
            "decode": ["full", "compressed"],
            "prefill-memory": ["two-phase", "streamed"],
        }[which]


class Workbench:
    """The models and inputs the cases of one process share, each built on first use."""

    def __init__(
        self, settings: BenchSettings, model: PreTrainedModel | None = None, share_model: bool = False
    ) -> None:
        """``model``: use it instead of loading ``settings.model`` (e.g. a depth-cut architecture);
        ``share_model``: inject the lookahead module into the model itself, not a copy (when only the
        training step runs: a copy of an 8B-wide model costs gigabytes)."""
        self.settings = settings
        self.share_model = share_model
        if model is not None:
            self.__dict__["model"] = model

    @cached_property
    def model(self) -> PreTrainedModel:
        s = self.settings
        return load_model(s.model, s.dtype, s.device, s.attn_implementation, s.num_layers)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @cached_property
    def lookahead(self):
        """A randomly initialised lookahead module on a *copy* of the model (unless ``share_model``).

        The LoRA is injected in place, so the plain prefill and the other methods keep running the
        unwrapped model, while LookaheadKV pays for peft's (disabled) wrappers in its own prefill.
        """
        from lkv.model.lookahead import LookaheadAdapter

        s = self.settings
        return LookaheadAdapter.create(
            self.model if self.share_model else copy.deepcopy(self.model),
            num_tokens=s.num_lookahead,
            lora_rank=s.lora_rank,
            seed=s.seed,
        )

    @cached_property
    def training_module(self):
        """``LookaheadKVModule`` around :attr:`lookahead`, so the benchmark runs its real ``training_step``."""
        from lkv.train.module import LookaheadKVModule

        s = self.settings
        module = LookaheadKVModule(
            model=s.model, dtype=s.dtype, num_lookahead=s.num_lookahead, lora_rank=s.lora_rank, seed=s.seed
        )
        module.adapter = self.lookahead  # configure_model() then keeps it instead of loading a backbone
        return module

    def prompt(self, length: int) -> torch.Tensor:
        """``(1, length)`` seeded random token ids."""
        generator = torch.Generator().manual_seed(self.settings.seed + length)
        ids = torch.randint(0, self.model.config.vocab_size, (1, length), generator=generator)
        return ids.to(self.device)

    def target(self, length: int) -> torch.Tensor:
        """``(layers, kv_heads, length)`` random label distributions."""
        config = self.model.config
        generator = torch.Generator().manual_seed(self.settings.seed)
        logits = torch.randn(
            config.num_hidden_layers, config.num_key_value_heads, length, generator=generator
        )
        return torch.softmax(logits, dim=-1).to(self.device)

    def press(self, method: str) -> Press:
        s = self.settings
        if method == "lookaheadkv":
            return LookaheadKVPress(self.lookahead)
        if method == "laq":  # its SnapKV-compressed draft cache keeps the eviction budget, as in the paper
            return make_method(method, draft_budget=s.budget, num_tokens=s.draft_tokens, window=s.window)
        if method == "speckv":
            return make_method(
                method, draft_layers=s.draft_layers, num_tokens=s.draft_tokens, window=s.window
            )
        if method in ("snapkv", "pyramidkv"):
            return make_method(method, window=s.window)
        return make_method(method)

    def case(self, which: str, variant: str, length: int) -> Case:
        builders = {
            "train-step": self._train_step,
            "ttft": self._ttft,
            "label": self._label,
            "decode": self._decode,
            "prefill-memory": self._prefill_memory,
        }
        if variant not in self.settings.variants(which):
            raise ValueError(f"{which} has no variant {variant!r}; it has {self.settings.variants(which)}")
        return builders[which](variant, length)

    def _train_step(self, variant: str, length: int) -> Case:
        from lkv.perf.naive_step import naive_loss

        ids, target = self.prompt(length), self.target(length)
        params = list(self.lookahead.trainable_parameters().values())

        def reset() -> None:
            for param in params:
                param.grad = None

        if variant in ("naive", "naive-eager"):
            attention = "eager" if variant == "naive-eager" else "capture"
            return Case(
                run=lambda: naive_loss(self.lookahead, ids, target, attention).backward(), reset=reset
            )
        module = self.training_module
        sample = {"id": "bench", "prompt_ids": ids[0], "response_ids": ids[0, :0], "scores": target}

        def two_phase() -> None:
            with warnings.catch_warnings():  # self.log() without a Trainer warns and does nothing
                warnings.simplefilter("ignore")
                loss = module.training_step([sample], 0)
            loss.backward()

        return Case(run=two_phase, reset=reset)

    def _ttft(self, variant: str, length: int) -> Case:
        from lkv.eviction.compressor import Compressor

        ids = self.prompt(length)
        if variant == "prefill":

            def plain() -> None:
                prefill(self.model, ids)

            return Case(run=plain)
        if self.settings.budget >= length:
            raise ValueError(f"ttft: budget {self.settings.budget} must be below the prompt length {length}")
        press = self.press(variant)
        model = press.base_model if isinstance(press, LookaheadKVPress) else self.model
        compressor = Compressor(model, None, press, budget=self.settings.budget)
        compressor.eos_token_ids = []  # LAQ/SpecKV pseudo responses always run their full length

        def run() -> dict[str, float]:
            out = compressor.compress(ids)
            return {"prefill_s": out.prefill_s, "eviction_s": out.eviction_s}

        return Case(run=run)

    def _label(self, variant: str, length: int) -> Case:
        from lkv.labels.labeller import label_prompt

        ids, tokens = self.prompt(length), self.settings.response_tokens
        model = self.model
        if variant.startswith(BATCH_PREFIX):
            from lkv.perf.label_batches import label_batches_case, spread_lengths

            s = self.settings
            count = s.label_prompts or max(s.batch_sizes)
            prompts = [
                self.prompt(n)[0].tolist() for n in spread_lengths(length, count, s.label_length_spread)
            ]
            return label_batches_case(model, prompts, int(variant.removeprefix(BATCH_PREFIX)), tokens)
        if variant == "label_prompt":

            def run() -> None:
                label = label_prompt(model, ids[0].tolist(), tokens, eos_token_ids=[])
                assert len(label.response_ids) == tokens and label.scores is not None

            return Case(run=run)

        @torch.no_grad()
        def generate_and_forward() -> None:
            out = model.generate(
                ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
            )
            assert out.shape[1] == length + tokens
            model(input_ids=out, logits_to_keep=1)

        return Case(run=generate_and_forward)

    def _decode(self, variant: str, length: int) -> Case:
        from lkv.eviction.compressor import Compressor

        ids, steps = self.prompt(length), self.settings.decode_tokens
        if variant == "full":
            source, logits = prefill(self.model, ids)
        else:
            if self.settings.budget >= length:
                raise ValueError(
                    f"decode: budget {self.settings.budget} must be below the prompt length {length}"
                )
            compressed = Compressor(self.model, None, self.press("snapkv"), self.settings.budget).compress(
                ids
            )
            source, logits = compressed.cache, compressed.next_logits
        state: dict[str, Any] = {}

        def reset() -> None:
            state["cache"] = copy.deepcopy(source)  # decoding grows the cache: every run starts afresh

        def run() -> None:
            # steps + 1 tokens = `steps` forward passes (the first token comes from the prefill's logits)
            decode(self.model, state["cache"], logits, length, steps + 1)

        entries = sum(layer.get_seq_length() for layer in source.layers)
        return Case(run=run, reset=reset, info={"kv_bytes": cache_bytes(source), "kv_entries": entries})

    def _prefill_memory(self, variant: str, length: int) -> Case:
        from lkv.eviction.compressor import Compressor

        if self.settings.budget >= length:
            raise ValueError(
                f"prefill-memory: budget {self.settings.budget} must be below the prompt length {length}"
            )
        ids, press = self.prompt(length), self.press(self.settings.stream_method)
        model = press.base_model if isinstance(press, LookaheadKVPress) else self.model
        compressor = Compressor(model, None, press, self.settings.budget, streamed=variant == "streamed")
        if not press.streamable:
            raise ValueError(f"prefill-memory: {press.name} has no layer-streamed eviction")

        def run() -> dict[str, float]:
            out = compressor.compress(ids)
            return {"prefill_s": out.prefill_s, "eviction_s": out.eviction_s}

        lookahead = self.settings.num_lookahead if isinstance(press, LookaheadKVPress) else 0
        dtype_bytes = next(model.parameters()).element_size()
        formula = peak_kv_bytes(model.config, length, self.settings.budget, lookahead, dtype_bytes)
        key = "streamed" if variant == "streamed" else "two_phase"
        return Case(run=run, info={"kv_formula_bytes": formula[key], "kv_full_bytes": formula["two_phase"]})


def memory_case(which: str, variant: str, length: int, settings: dict[str, Any]) -> Case:
    """Entry point of the CPU memory subprocess: one case, built from scratch."""
    return Workbench(BenchSettings(**settings)).case(which, variant, length)


def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _measure_length(
    bench: Workbench, which: str, length: int, repeats: int, warmup: int, memory: bool, threads: int
) -> dict[str, Any]:
    """All variants of ``which`` at one prompt length: timings, extras, peak memory (or the error)."""
    device = bench.device
    cases: dict[str, Case] = {}
    failed: dict[str, str] = {}
    for variant in bench.settings.variants(which, length):
        try:
            cases[variant] = bench.case(which, variant, length)
            if device.type == "cuda":  # find variants that do not fit before timing the others
                cases[variant].reset()
                cases[variant].run()
        except RuntimeError as error:
            if not _is_oom(error):
                raise
            cases.pop(variant, None)
            failed[variant] = "out of memory"
        if variant in failed:  # outside the handler, whose traceback still holds the failed run's tensors
            torch.cuda.empty_cache()
    timings = time_interleaved(cases, repeats, warmup, device) if cases else Timings({}, {})
    out: dict[str, Any] = {}
    for variant in bench.settings.variants(which, length):
        if variant in failed:
            out[variant] = {"error": failed[variant]}
            continue
        entry: dict[str, Any] = {"seconds": timings.seconds[variant], "median_s": timings.median(variant)}
        entry.update({f"median_{k}": timings.extra_median(variant, k) for k in timings.extras[variant]})
        entry.update(cases[variant].info)
        if memory and which in MEASURES_MEMORY:
            if device.type == "cuda":
                entry["peak_bytes"] = cuda_peak_bytes(cases[variant], device)
            else:
                settings = asdict(bench.settings)
                if variant.startswith(BATCH_PREFIX):
                    # one batch: batches run one after another and free their caches, so one batch's
                    # peak is the run's (and a fresh subprocess need not label every prompt twice)
                    settings["label_prompts"] = int(variant.removeprefix(BATCH_PREFIX))
                kwargs = {"which": which, "variant": variant, "length": length, "settings": settings}
                entry.update(subprocess_peak_bytes("lkv.perf.bench:memory_case", kwargs, threads))
        out[variant] = entry
    reference = bench.settings.reference(which)
    if reference in cases:
        for variant in cases:
            if variant != reference:
                out[variant]["minus_reference_s"] = timings.paired_difference(variant, reference)
    return out


def derive(which: str, settings: BenchSettings, lengths: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The figures each sub-benchmark is judged by, from its raw measurements (missing ones are skipped)."""

    def ok(*entries: dict) -> bool:
        return all("median_s" in entry for entry in entries)

    derived: dict[str, Any] = {}
    for length, v in lengths.items():
        d: dict[str, Any] = {}
        if which == "train-step" and ok(v["two-phase"]):
            for variant, suffix in (("naive", ""), ("naive-eager", "_eager")):
                if ok(v.get(variant, {})):
                    d["speedup" + suffix] = v[variant]["median_s"] / v["two-phase"]["median_s"]
                    if "peak_bytes" in v[variant]:
                        d["memory_ratio" + suffix] = v[variant]["peak_bytes"] / v["two-phase"]["peak_bytes"]
        elif which == "ttft" and ok(v["prefill"]):
            base = v["prefill"]["median_s"]
            for method in settings.methods:
                if ok(v[method]):
                    overhead = v[method]["minus_reference_s"]
                    d[method] = {
                        "overhead_s": overhead,
                        "overhead_pct": 100 * overhead / base,
                        # scoring + selection + gathering alone: short, so far less noisy than a difference
                        # of two prefills (but blind to work inside the prefill, e.g. SnapKV's capture)
                        "eviction_pct": 100 * v[method]["median_eviction_s"] / base,
                    }
            if "lookaheadkv" in d:
                d["lookaheadkv"]["floor_pct"] = 100 * settings.num_lookahead / length
                for method in settings.methods:
                    if method in d and method != "lookaheadkv":
                        # all their extra work happens in the eviction stage, so compare it there
                        d[method]["x_lookaheadkv"] = (
                            d[method]["eviction_pct"] / d["lookaheadkv"]["eviction_pct"]
                        )
        elif which == "label" and settings.batch_sizes:
            base = v[settings.reference(which)]
            for variant, entry in v.items():
                if ok(entry):
                    d[variant] = {"prompts_per_s": entry["prompts"] / entry["median_s"]}
                    if ok(base):
                        d[variant]["speedup"] = base["median_s"] / entry["median_s"]
        elif which == "label" and ok(v["label_prompt"], v["generate+forward"]):
            d["ratio"] = v["label_prompt"]["median_s"] / v["generate+forward"]["median_s"]
        elif which == "decode" and ok(v["full"], v["compressed"]):
            steps = settings.decode_tokens
            d["full_s_per_token"] = v["full"]["median_s"] / steps
            d["compressed_s_per_token"] = v["compressed"]["median_s"] / steps
            d["speedup"] = d["full_s_per_token"] / d["compressed_s_per_token"]
            d["kv_bytes_ratio"] = v["compressed"]["kv_bytes"] / v["full"]["kv_bytes"]
            d["budget_over_length"] = settings.budget / length
        elif which == "prefill-memory" and ok(v["two-phase"], v["streamed"]):
            d["time_ratio"] = v["streamed"]["median_s"] / v["two-phase"]["median_s"]
            if "peak_bytes" in v["two-phase"] and "peak_bytes" in v["streamed"]:
                d["memory_ratio"] = v["two-phase"]["peak_bytes"] / v["streamed"]["peak_bytes"]
                d["saved_bytes"] = v["two-phase"]["peak_bytes"] - v["streamed"]["peak_bytes"]
                d["formula_saved_bytes"] = (
                    v["two-phase"]["kv_formula_bytes"] - v["streamed"]["kv_formula_bytes"]
                )
        derived[length] = d
    if which == "label":
        for variant in settings.variants(which):
            points = [(n, v[variant]["peak_bytes"]) for n, v in lengths.items() if "peak_bytes" in v[variant]]
            if len(points) >= 2:
                derived[f"{variant}_peak_vs_length"] = linear_fit(*zip(*points, strict=True))
    return derived


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def markdown(which: str, result: dict[str, Any]) -> str:
    """A table of one sub-benchmark's result (the ``benchmarks[which]`` part of the JSON)."""
    rows: list[list[str]] = []
    lengths, derived = result["lengths"], result["derived"]

    def get(length: str, variant: str, key: str) -> float | None:
        return lengths[length].get(variant, {}).get(key)

    def peak(length: str, variant: str) -> str:
        return _fmt(get(length, variant, "peak_bytes"), MIB, 0)

    for length in lengths:
        d = derived[length]
        if which == "train-step":
            head = [
                "S",
                "two-phase s/step",
                "naive s/step",
                "speed-up",
                "two-phase peak MiB",
                "naive peak MiB",
                "memory ratio",
                "naive-eager s/step",
                "speed-up (eager)",
                "naive-eager peak MiB",
                "memory ratio (eager)",
            ]
            rows.append(
                [
                    length,
                    _fmt(get(length, "two-phase", "median_s")),
                    _fmt(get(length, "naive", "median_s")),
                    _ratio(d.get("speedup")),
                    peak(length, "two-phase"),
                    peak(length, "naive"),
                    _ratio(d.get("memory_ratio")),
                    _fmt(get(length, "naive-eager", "median_s")),
                    _ratio(d.get("speedup_eager")),
                    peak(length, "naive-eager"),
                    _ratio(d.get("memory_ratio_eager")),
                ]
            )
        elif which == "ttft":
            head = [
                "S",
                "method",
                "TTFT s",
                "eviction s",
                "eviction %",
                "overhead ms",
                "overhead %",
                "eviction × LookaheadKV",
            ]
            rows.append(
                [length, "plain prefill", _fmt(get(length, "prefill", "median_s")), "", "", "", "", ""]
            )
            for method in result["settings"]["methods"]:
                m = d.get(method, {})
                note = f" (floor M/S = {m['floor_pct']:.2f} %)" if "floor_pct" in m else ""
                rows.append(
                    [
                        length,
                        method + note,
                        _fmt(get(length, method, "median_s")),
                        _fmt(get(length, method, "median_eviction_s")),
                        _fmt(m.get("eviction_pct"), digits=2),
                        _fmt(m.get("overhead_s"), 1e-3, 1),
                        _fmt(m.get("overhead_pct"), digits=2),
                        _fmt(m.get("x_lookaheadkv"), digits=1),
                    ]
                )
        elif which == "label" and result["settings"]["batch_sizes"]:
            head = ["S", "batch", "prompts", "padding %", "s", "prompts/s", "speed-up", "peak MiB"]
            for variant, entry in lengths[length].items():
                if "median_s" not in entry:
                    continue
                figures = d.get(variant, {})
                rows.append(
                    [
                        length,
                        entry["batch_size"],
                        entry["prompts"],
                        _fmt(100 * entry["padding_fraction"], digits=1),
                        _fmt(entry["median_s"], digits=1),
                        _fmt(figures.get("prompts_per_s"), digits=3),
                        _ratio(figures.get("speedup")),
                        peak(length, variant),
                    ]
                )
        elif which == "label":
            head = [
                "S",
                "label_prompt s",
                "generate + forward s",
                "ratio",
                "label_prompt peak MiB",
                "baseline peak MiB",
            ]
            rows.append(
                [
                    length,
                    _fmt(get(length, "label_prompt", "median_s")),
                    _fmt(get(length, "generate+forward", "median_s")),
                    _fmt(d.get("ratio"), digits=3),
                    peak(length, "label_prompt"),
                    peak(length, "generate+forward"),
                ]
            )
        elif which == "prefill-memory":
            head = [
                "S",
                "two-phase s",
                "streamed s",
                "streamed/two-phase time",
                "two-phase peak MiB",
                "streamed peak MiB",
                "memory ratio",
                "saved MiB",
                "formula: saved MiB",
                "formula: streamed K/V MiB",
            ]
            rows.append(
                [
                    length,
                    _fmt(get(length, "two-phase", "median_s")),
                    _fmt(get(length, "streamed", "median_s")),
                    _fmt(d.get("time_ratio"), digits=2),
                    peak(length, "two-phase"),
                    peak(length, "streamed"),
                    _ratio(d.get("memory_ratio")),
                    _fmt(d.get("saved_bytes"), MIB, 0),
                    _fmt(d.get("formula_saved_bytes"), MIB, 0),
                    _fmt(get(length, "streamed", "kv_formula_bytes"), MIB, 1),
                ]
            )
        else:
            head = [
                "S",
                "full ms/token",
                "compressed ms/token",
                "speed-up",
                "full KV MiB",
                "kept KV MiB",
                "kept/full",
                "budget/S",
            ]
            rows.append(
                [
                    length,
                    _fmt(d.get("full_s_per_token"), 1e-3, 2),
                    _fmt(d.get("compressed_s_per_token"), 1e-3, 2),
                    _ratio(d.get("speedup")),
                    _fmt(get(length, "full", "kv_bytes"), MIB, 2),
                    _fmt(get(length, "compressed", "kv_bytes"), MIB, 2),
                    _fmt(d.get("kv_bytes_ratio"), digits=4),
                    _fmt(d.get("budget_over_length"), digits=4),
                ]
            )
    for length in lengths:
        for variant, entry in lengths[length].items():
            if "error" in entry:
                rows.append([length, f"{variant}: {entry['error']}"] + [""] * (len(head) - 2))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    for key, fit in derived.items():
        if key.endswith("_peak_vs_length"):
            sign = "+" if fit["intercept"] >= 0 else "−"
            lines.append(
                f"\n{key.removesuffix('_peak_vs_length')} peak memory ≈ {fit['slope'] / 1024:.1f} KiB/token × S "
                f"{sign} {abs(fit['intercept']) / MIB:.0f} MiB (largest deviation from the line "
                f"{100 * fit['max_rel_residual']:.1f} %)"
            )
    return "\n".join(lines)


def environment(threads: int, device: torch.device) -> dict[str, Any]:
    """Machine and software facts recorded with every result."""
    import transformers

    info: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["lkv", *sys.argv[1:]]) if sys.argv[0].endswith("lkv") else " ".join(sys.argv),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        names = (
            [
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ]
            if cpuinfo.is_file()
            else []
        )
        info["cpu"] = names[0] if names else platform.processor()
    return info


def run_benchmarks(
    selected: list[str],
    settings: BenchSettings,
    lengths: list[int] | dict[str, list[int]] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    memory: bool = True,
) -> dict[str, Any]:
    """Run the ``selected`` sub-benchmarks (see :func:`lkv.commands.bench.bench`), print their tables, return all results."""
    unknown = [name for name in selected if name not in (*BENCHMARKS, TRAIN_MEMORY)]
    if unknown:
        raise ValueError(
            f"--which: unknown sub-benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}, "
            f"{TRAIN_MEMORY} or all"
        )
    if isinstance(lengths, dict):
        extra = sorted(set(lengths) - set(selected))
        if extra:
            raise ValueError(f"--lengths names sub-benchmarks {extra} that --which does not select")
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(settings.seed)
    workbench = Workbench(settings)
    # the settings' device, not the model's: asking the model would load it (train-memory never does)
    device = torch.device(settings.device or "cpu")
    results: dict[str, Any] = {"environment": environment(threads, device), "benchmarks": {}}
    for name in selected:
        defaults = TRAIN_MEMORY_LENGTHS if name == TRAIN_MEMORY else DEFAULT_LENGTHS[name]
        sizes = lengths.get(name, defaults) if isinstance(lengths, dict) else lengths or defaults
        if name == TRAIN_MEMORY:
            from lkv.perf import shape_memory

            def on_model(model: PreTrainedModel) -> Workbench:
                return Workbench(settings, model=model, share_model=True)

            result = {"settings": asdict(settings), **shape_memory.measure(settings, sorted(sizes), on_model)}
            results["benchmarks"][name] = result
            print(f"\n## {name} ({settings.model}, {settings.dtype}, fake tensors)\n")
            print(shape_memory.markdown(result), flush=True)
            continue
        measured = {
            str(n): _measure_length(workbench, name, n, repeats, warmup, memory, threads)
            for n in sorted(sizes)
        }
        derived = derive(name, settings, {int(n): m for n, m in measured.items()})
        result = {
            "settings": asdict(settings),
            "repeats": repeats,
            "warmup": warmup,
            "lengths": measured,
            "derived": {str(k): v for k, v in derived.items()},
        }
        results["benchmarks"][name] = result
        print(f"\n## {name} ({settings.model}, {settings.dtype}, {workbench.device}, {threads} threads)\n")
        print(markdown(name, result), flush=True)
    results["environment"]["load_average_end"] = os.getloadavg()
    return results
