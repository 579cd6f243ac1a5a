"""`lkv bench` and its measurement helpers on tiny models.

* the two-phase training step of lkv.train.module and the naive masked full-sequence step give the same loss and
  gradients (which proves the two-phase step exact), and the mask is what makes them agree;
* the CPU peak-memory method recovers a known allocation, unpolluted by a larger one measured before;
* the interleaved timer, the line fit, the benchmark architectures;
* every sub-benchmark end to end through the `lkv` entry point, with its derived figures.
"""

import contextlib
import json

import pytest
import torch
from peft.tuners.lora import LoraLayer

import lkv.perf.naive_step
from lkv.cli import main
from lkv.model.lookahead import LookaheadAdapter
from lkv.perf.bench import build_case, run_benchmarks
from lkv.perf.memory import subprocess_peak_bytes
from lkv.perf.models import ARCHITECTURES, random_model
from lkv.perf.naive_step import naive_loss
from lkv.perf.suites import SUITES
from lkv.perf.timing import Case, linear_fit, time_interleaved
from lkv.perf.workbench import BenchSettings, Workbench
from lkv.train.module import LookaheadKVModule
from tests.conftest import build_tiny_model

TINY = {
    "model": "random:tiny-llama",
    "budget": 16,
    "window": 8,
    "num_lookahead": 4,
    "lora_rank": 2,
    "draft_tokens": 3,
    "response_tokens": 4,
    "decode_tokens": 3,
}


def perturbed_adapter(model) -> LookaheadAdapter:
    adapter = LookaheadAdapter.create(model, num_tokens=4, lora_rank=2)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in adapter.trainable_parameters().items():
            if "lora_B" in name:  # B = 0 at creation would hide a LoRA leaking into the prompt
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return adapter


def grads(adapter: LookaheadAdapter) -> dict[str, torch.Tensor]:
    out = {
        name: param.grad.clone()
        for name, param in adapter.trainable_parameters().items()
        if param.grad is not None
    }
    for param in adapter.trainable_parameters().values():
        param.grad = None
    return out


@pytest.mark.parametrize("attention", ["capture", "eager"])
def test_two_phase_step_equals_the_naive_masked_step(tiny_model, monkeypatch, attention):
    model, _ = tiny_model
    adapter = perturbed_adapter(model)
    module = LookaheadKVModule(model="tiny", num_lookahead=4, lora_rank=2)
    module.adapter = adapter
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=generator)
    config = model.config
    target = torch.softmax(
        torch.randn(config.num_hidden_layers, config.num_key_value_heads, 40, generator=generator), -1
    )
    sample = {"id": "x", "prompt_ids": ids[0], "response_ids": ids[0, :0], "scores": target}

    with pytest.warns(UserWarning, match="self.log"):
        two_phase = module.training_step([sample], 0)
    two_phase.backward()
    want = grads(adapter)
    implementation = model.config._attn_implementation
    naive = naive_loss(adapter, ids, target, attention)
    naive.backward()
    assert model.config._attn_implementation == implementation
    got = grads(adapter)
    torch.testing.assert_close(naive, two_phase, atol=1e-6, rtol=1e-5)
    assert set(got) == set(want) and len(got) > 1
    for name in want:
        # the two paths run different attention kernels (sdpa or eager vs the capture's fp32 einsum), whose
        # rounding the backward amplifies in the small last-layer gradients: up to ~2e-4 of a tensor's largest
        # entry (a wrong mask or missing gradient moves them by O(1) of it)
        atol = 5e-4 * want[name].abs().max().item()
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=1e-4, msg=name)
    # the naive step switched the adapter off again and left no hooks behind
    lora_layers = [m for m in adapter.model.modules() if isinstance(m, LoraLayer)]
    assert lora_layers and all(m.disable_adapters for m in lora_layers)
    assert not any(b._forward_hooks for m in lora_layers for b in m.lora_B.values())
    # Without the per-token mask the LoRA also changes the prompt's K/V, and the losses part.
    monkeypatch.setattr(lkv.perf.naive_step, "masked_lora", lambda model, mask: contextlib.nullcontext())
    assert (naive_loss(adapter, ids, target, attention) - two_phase).abs() > 1e-4


def test_cpu_peak_memory_recovers_known_allocations_without_pollution():
    big = subprocess_peak_bytes("lkv.perf.memory:calibration_case", {"mebibytes": 96}, threads=1)
    small = subprocess_peak_bytes("lkv.perf.memory:calibration_case", {"mebibytes": 16}, threads=1)
    assert big["hwm_reset"] and small["hwm_reset"]
    assert abs(big["peak_bytes"] - 96 * 2**20) < 2**20
    assert abs(small["peak_bytes"] - 16 * 2**20) < 2**20
    with pytest.raises(RuntimeError, match="memory measurement of lkv.perf.memory:nope"):
        subprocess_peak_bytes("lkv.perf.memory:nope", {}, threads=1)


def test_time_interleaved_rotates_rounds_and_skips_warmup():
    calls: list[str] = []

    def case(name: str) -> Case:
        def run() -> dict[str, float]:
            calls.append(name)
            return {"n": len(calls)}

        return Case(run=run, reset=lambda: calls.append("reset"))

    timings = time_interleaved(
        {"a": case("a"), "b": case("b")}, repeats=2, warmup=1, device=torch.device("cpu")
    )
    runs = [c for c in calls if c != "reset"]
    assert runs == ["a", "b", "b", "a", "a", "b"]
    assert calls[::2] == ["reset"] * 6
    assert len(timings.seconds["a"]) == len(timings.seconds["b"]) == 2
    assert timings.extras["a"]["n"] == [8.0, 10.0] and timings.extras["b"]["n"] == [6.0, 12.0]
    assert timings.paired_difference("a", "a") == 0
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved({"a": case("a")}, repeats=0, warmup=0, device=torch.device("cpu"))


def test_linear_fit():
    fit = linear_fit([1, 2, 4], [12, 22, 42])
    assert fit["slope"] == pytest.approx(10) and fit["intercept"] == pytest.approx(2)
    assert fit["max_rel_residual"] == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize(
    ("architecture", "billions"),
    [("llama-3.1-8b", 8.030), ("qwen3-8b", 8.191), ("llama-3.2-1b", 1.236), ("smollm2-135m", 0.1345)],
)
def test_benchmark_architectures_have_the_published_sizes(architecture, billions):
    model = random_model(architecture, torch.bfloat16, device="meta")
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, rel=1e-3)
    assert model.config._attn_implementation == "lkv_sdpa" and model.generation_config.eos_token_id is None
    with pytest.raises(ValueError, match="unknown architecture"):
        random_model("gpt-5")
    assert "tiny-llama" in ARCHITECTURES


def test_ttft_of_the_kvpress_era_presses(tmp_path, capsys):
    """Expected Attention, KeyDiff and KVzip in the ttft suite; KVzip writes its repeat prompt with the
    model's tokenizer, which a model folder has and a random model has not."""
    model, tokenizer = build_tiny_model("llama")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    methods = ["expected_attention", "keydiff", "kvzip"]
    settings = BenchSettings(**{**TINY, "model": str(tmp_path / "model"), "methods": methods})
    ttft = run_benchmarks(["ttft"], settings, [48], 1, 0, 1, False)["benchmarks"]["ttft"]
    assert set(ttft["derived"]["48"]) == set(methods)
    assert all(ttft["lengths"]["48"][m]["median_eviction_s"] > 0 for m in methods)
    with pytest.raises(ValueError, match="give the Compressor a tokenizer"):
        run_benchmarks(["ttft"], BenchSettings(**{**TINY, "methods": ["kvzip"]}), [48], 1, 0, 1, False)


def test_every_sub_benchmark_end_to_end(capsys):
    settings = BenchSettings(**TINY)
    results = run_benchmarks(["ttft", "decode", "label", "train-step"], settings, [48, 64], 1, 0, 1, False)
    benches = results["benchmarks"]
    assert results["environment"]["threads"] == 1 and len(results["environment"]["load_average_end"]) == 3
    ttft = benches["ttft"]
    for length in ("48", "64"):
        entry = ttft["lengths"][length]
        assert set(entry) == {"prefill", "snapkv", "lookaheadkv", "laq", "speckv"}
        assert entry["laq"]["median_eviction_s"] > 0 and entry["laq"]["minus_reference_s"] is not None
        assert set(ttft["derived"][length]) == {"snapkv", "lookaheadkv", "laq", "speckv"}
    assert ttft["derived"]["64"]["lookaheadkv"]["floor_pct"] == pytest.approx(100 * 4 / 64)
    decode = benches["decode"]["derived"]
    # the compressed cache really holds budget/S of the bytes
    assert decode["48"]["kv_bytes_ratio"] == decode["48"]["budget_over_length"] == 16 / 48
    assert decode["64"]["kv_bytes_ratio"] == 16 / 64
    assert benches["decode"]["lengths"]["64"]["compressed"]["kv_entries"] == 3 * 16
    assert benches["label"]["derived"]["48"]["ratio"] > 0
    assert benches["train-step"]["derived"]["64"]["speedup"] > 0
    out = capsys.readouterr().out
    assert (
        "## ttft" in out
        and "| 64 | laq |" in out
        and "lookaheadkv (floor M/S = 6.25 %)" in out
        and "## train-step" in out
    )


def test_memory_of_the_naive_step_exceeds_the_two_phase_step():
    results = run_benchmarks(["train-step"], BenchSettings(**TINY), [512], 1, 0, 1, True)
    entry = results["benchmarks"]["train-step"]["lengths"]["512"]
    assert entry["naive"]["peak_bytes"] > 2 * entry["two-phase"]["peak_bytes"] > 0
    assert results["benchmarks"]["train-step"]["derived"]["512"]["memory_ratio"] > 2
    # the guides' eager step keeps every layer's (S+M)² attention maps for backward
    assert entry["naive-eager"]["peak_bytes"] > entry["naive"]["peak_bytes"]
    assert results["benchmarks"]["train-step"]["derived"]["512"]["memory_ratio_eager"] > 2


def test_eager_naive_step_stops_at_its_length_limit():
    settings = BenchSettings(**TINY, eager_max_length=256)
    assert SUITES["train-step"].variants(settings, 256) == ["two-phase", "naive", "naive-eager"]
    assert SUITES["train-step"].variants(settings, 512) == ["two-phase", "naive"]


def test_cli_selection_lengths_and_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--model", "random:tiny-llama", "--budget", "16", "--window", "8", "--threads", "1"]
    args += ["--repeats", "1", "--warmup", "0", "--decode_tokens", "2", "--json_out", str(out)]
    main(["bench", "--which", "decode", "--lengths", "[40]", *args])
    assert list(json.loads(out.read_text())["benchmarks"]["decode"]["lengths"]) == ["40"]
    main(
        [
            "bench",
            "--which",
            "[decode,ttft]",
            "--lengths",
            '{"decode": [24], "ttft": [32]}',
            "--methods",
            "[snapkv,probe]",
            "--probe_hidden",
            "8",
            *args,
        ]
    )
    written = json.loads(out.read_text())["benchmarks"]
    assert list(written["decode"]["lengths"]) == ["24"] and list(written["ttft"]["lengths"]["32"]) == [
        "prefill",
        "snapkv",
        "probe",
    ]
    assert "median_s" in written["ttft"]["lengths"]["32"]["probe"]
    printed = capsys.readouterr().out
    assert "| 32 | snapkv |" in printed and "| 32 | probe |" in printed
    with pytest.raises(ValueError, match="unknown sub-benchmark"):
        run_benchmarks(["nope"], BenchSettings(**TINY))
    with pytest.raises(ValueError, match="does not select"):
        run_benchmarks(["decode"], BenchSettings(**TINY), {"ttft": [32]})
    with pytest.raises(ValueError, match="below the prompt length"):
        build_case(Workbench(BenchSettings(**TINY)), "decode", "compressed", 16)


def test_streamed_prefill_needs_less_memory_than_two_phase(capsys):
    # 24 tiny layers at 2K: 12 MiB of full K/V in fp32 against one layer's 0.5 MiB + 24 × 16 kept entries
    settings = BenchSettings(**TINY, num_layers=24)
    results = run_benchmarks(["prefill-memory"], settings, [2048], 1, 0, 1, True)
    entry = results["benchmarks"]["prefill-memory"]["lengths"]["2048"]
    derived = results["benchmarks"]["prefill-memory"]["derived"]["2048"]
    assert entry["two-phase"]["kv_formula_bytes"] == entry["streamed"]["kv_full_bytes"]
    assert entry["two-phase"]["kv_formula_bytes"] > 8 * entry["streamed"]["kv_formula_bytes"]
    # the prefill's own activations come on top of the K/V in both variants
    assert derived["memory_ratio"] > 1.3 and derived["saved_bytes"] > 0.5 * derived["formula_saved_bytes"]
    assert "| 2048 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no layer-streamed eviction"):
        build_case(Workbench(BenchSettings(**TINY, stream_method="laq")), "prefill-memory", "streamed", 64)
    with pytest.raises(ValueError, match="random:<architecture> models only"):
        Workbench(BenchSettings(model="smollm2-135m", num_layers=2)).model  # noqa: B018


def test_label_at_several_batch_sizes(capsys):
    settings = BenchSettings(**{**TINY, "batch_sizes": [1, 2, 4], "label_prompts": 5})
    results = run_benchmarks(["label"], settings, [48], 1, 0, 1, False)
    entry = results["benchmarks"]["label"]["lengths"]["48"]
    assert set(entry) == {"batch-1", "batch-2", "batch-4"}
    assert entry["batch-1"]["padding_fraction"] == 0  # one prompt per batch pads nothing
    assert 0 < entry["batch-4"]["padding_fraction"] < 0.25
    derived = results["benchmarks"]["label"]["derived"]["48"]
    assert derived["batch-1"]["speedup"] == 1 and derived["batch-4"]["prompts_per_s"] > 0
    assert "| 48 | 4 | 5 |" in capsys.readouterr().out


def test_decode_at_several_batch_sizes(capsys):
    settings = BenchSettings(**{**TINY, "batch_sizes": [1, 2, 4], "label_prompts": 5})
    results = run_benchmarks(["decode"], settings, [48], 1, 0, 1, False)
    entry = results["benchmarks"]["decode"]["lengths"]["48"]
    assert set(entry) == {"batch-1", "batch-2", "batch-4"}
    assert {e["tokens"] for e in entry.values()} == {5 * TINY["decode_tokens"]}  # every variant, same work
    derived = results["benchmarks"]["decode"]["derived"]["48"]
    assert derived["batch-1"]["speedup"] == 1 and derived["batch-4"]["tokens_per_s"] > 0
    assert "| 48 | 4 | 5 | 15 |" in capsys.readouterr().out


@pytest.mark.parametrize("share", [False, True])
def test_lookahead_module_shares_the_model_only_when_asked(share):
    # prefill-memory (one_model) measures both variants on one model; the others keep the plain one unwrapped
    bench = Workbench(BenchSettings(**TINY), share_model=share)
    assert (bench.lookahead.base_model is bench.model) is share
    wrapped = any("lora_" in name for name, _ in bench.model.named_modules())
    assert wrapped is share
    assert SUITES["prefill-memory"].one_model and not SUITES["ttft"].one_model
