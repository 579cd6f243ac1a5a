"""`lkv bench`: side-by-side speed and memory benchmarks (train step, TTFT, labelling, decoding)."""

from __future__ import annotations

import json
from pathlib import Path


def bench(
    which: str | list[str] = "all",
    lengths: list[int] | dict[str, list[int]] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    model: str = "smollm2-135m",
    dtype: str = "float32",
    device: str | None = None,
    attn_implementation: str = "sdpa",
    threads: int | None = None,
    memory: bool = True,
    methods: list[str] | None = None,
    budget: int = 256,
    window: int = 32,
    num_lookahead: int = 32,
    lora_rank: int = 8,
    probe_hidden: int = 512,
    draft_tokens: int = 8,
    draft_layers: int | None = None,
    response_tokens: int = 64,
    decode_tokens: int = 32,
    eager_max_length: int = 2048,
    stream_method: str = "lookaheadkv",
    num_layers: int | None = None,
    batch_sizes: list[int] | None = None,
    label_prompts: int | None = None,
    label_length_spread: float = 0.25,
    seed: int = 0,
    json_out: str | None = None,
) -> None:
    """Side-by-side speed and memory benchmarks; prints one Markdown table per sub-benchmark.

    Args:
        which: ``train-step``, ``ttft``, ``label``, ``decode``, ``prefill-memory``, a list of them, or ``all``
            (those five); ``train-memory`` only when named.
        lengths: prompt lengths in tokens, for every selected sub-benchmark, or per sub-benchmark as
            ``{"ttft": [8192, 16384], ...}``; default: train-step/label/decode 1K–4K, ttft 1K–8K,
            prefill-memory 4K–8K.
        repeats: measured repetitions per variant (medians are reported).
        warmup: unmeasured rounds before them.
        model: ``smollm2-135m`` (default), a local folder or ``.gguf`` file, a hub id, or
            ``random:<architecture>`` (a randomly initialised model, e.g. ``random:llama-3.1-8b``; see
            ``lkv.perf.models.ARCHITECTURES``).
        dtype: ``float32`` (CPU) or ``bfloat16``/``float16`` (GPU).
        device: ``cpu`` (default) or ``cuda``.
        attn_implementation: attention of the model (``sdpa``, ``eager``, ``flash_attention_2``).
        threads: ``torch.set_num_threads`` for every variant and memory subprocess (default: torch's).
        memory: also measure peak memory (train-step, label, prefill-memory).
        methods: ttft methods besides the plain prefill (default: snapkv, lookaheadkv, laq, speckv; also any
            registered prefill method, e.g. ``probe``, a randomly initialised per-token probe).
        budget: KV entries kept per head (ttft, decode; LAQ's draft cache too).
        window: observation window of SnapKV, LAQ and SpecKV.
        num_lookahead: LookaheadKV's M (train-step, ttft).
        lora_rank: LookaheadKV's LoRA rank.
        probe_hidden: the per-token probe's MLP width (``probe``, ttft; 0: a linear probe).
        draft_tokens: pseudo-response tokens of LAQ and SpecKV.
        draft_layers: layers of SpecKV's self-speculative draft (default: a quarter of the model's).
        response_tokens: R, the response length of the label benchmark.
        decode_tokens: tokens decoded per run of the decode benchmark.
        eager_max_length: longest prompt at which train-step also runs ``naive-eager``, whose attention maps
            kept for backward grow as S² (SmolLM2 in fp32: 14 GiB measured at 2K, ≈ 51 GiB at 4K).
        stream_method: the method whose prefill + eviction prefill-memory measures two-phase vs layer-streamed
            (a streamable one: lookaheadkv, snapkv, pyramidkv, tova, h2o, streamingllm, random).
        num_layers: decoder layers of a ``random:`` model (each of the published shape), so that a large
            architecture fits a small machine; default: the published count.
        batch_sizes: label and decode benchmarks at these batch sizes (e.g. ``[1,4,8,16]``): ``lkv label
            --batch_size``'s labeller on the same prompts at each, prompts/s side by side (instead of
            label_prompt vs generate + forward); ``lkv eval --batch_size``'s decoding of the same
            SnapKV-compressed answers at each, tokens/s side by side (instead of full vs compressed).
        label_prompts: prompts (answers) each batch-size variant labels (decodes); default: the largest
            batch size.
        label_length_spread: those prompts' lengths spread evenly over ``[(1 - spread) · S, S]``.
        seed: seed of prompts, labels and module initialisation.
        json_out: write the full results (raw times, medians, ratios, environment) to this JSON file.
    """
    from lkv.perf.bench import BENCHMARKS, run_benchmarks  # after parsing: `--help` loads no torch
    from lkv.perf.workbench import BenchSettings

    selected = list(BENCHMARKS) if which == "all" else [which] if isinstance(which, str) else list(which)
    settings = BenchSettings(
        model=model,
        dtype=dtype,
        device=device,
        attn_implementation=attn_implementation,
        methods=list(methods) if methods is not None else BenchSettings().methods,
        budget=budget,
        window=window,
        num_lookahead=num_lookahead,
        lora_rank=lora_rank,
        probe_hidden=probe_hidden,
        draft_tokens=draft_tokens,
        draft_layers=draft_layers,
        response_tokens=response_tokens,
        decode_tokens=decode_tokens,
        eager_max_length=eager_max_length,
        stream_method=stream_method,
        num_layers=num_layers,
        batch_sizes=list(batch_sizes) if batch_sizes else None,
        label_prompts=label_prompts,
        label_length_spread=label_length_spread,
        seed=seed,
    )
    results = run_benchmarks(selected, settings, lengths, repeats, warmup, threads, memory)
    if json_out is not None:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {path}")
