"""`lkv bench --which train-memory`: the live-tensor counter, and fake tensors counting what real ones do."""

import torch

from lkv.perf.bench import build_case, run_benchmarks
from lkv.perf.shape_memory import LiveTensorBytes, step_peak_bytes
from lkv.perf.workbench import BenchSettings, Workbench

MIB = 2**20


def test_counter_sees_allocations_views_and_frees():
    weight = torch.ones(MIB // 4)  # made before: never counted, nor a view of it
    with LiveTensorBytes() as tracker:
        tracker.ignore([weight])
        _ = weight.t()
        a = torch.zeros(MIB // 4)  # 1 MiB
        view = a.view(2, -1)  # shares a's storage
        b = view * 2  # 1 MiB more
        del a, view, b
        c = torch.zeros(MIB // 8)  # 0.5 MiB once both are gone
    assert tracker.peak == 2 * MIB
    assert tracker.current == MIB // 2
    del c


def test_fake_step_counts_what_the_real_step_allocates():
    """The fake tensors change no shape, so the count equals the one over a real step's tensors."""
    bench = Workbench(BenchSettings(model="random:tiny-llama", num_lookahead=4, lora_rank=2))
    fake = step_peak_bytes(bench, 96)
    module = bench.training_module
    tracker = LiveTensorBytes()
    tracker.ignore([*module.parameters(), *module.buffers()])
    case = build_case(bench, "train-step", "two-phase", 96)
    case.reset()
    with tracker:
        case.run()
    assert fake == tracker.peak > 0


def test_train_memory_projects_the_full_depth():
    settings = BenchSettings(model="random:tiny-llama", num_lookahead=4, lora_rank=2)
    result = run_benchmarks(["train-memory"], settings, [64, 128], 1, 0, 1, False)["benchmarks"][
        "train-memory"
    ]
    assert result["layers"] == 3
    for entry in result["lengths"].values():
        one, two = entry["peak_bytes"]["1"], entry["peak_bytes"]["2"]
        assert entry["per_layer_bytes"] == two - one > 0
        assert entry["step_bytes"] == one + 2 * (two - one)
    # longer prompts keep more per layer (their KV cache, the lookahead rows over S keys)
    assert result["lengths"]["128"]["per_layer_bytes"] > result["lengths"]["64"]["per_layer_bytes"]
