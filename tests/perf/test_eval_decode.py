"""`lkv bench --which decode --batch_sizes`: the same compressed answers decoded B at a time, side by side."""

from lkv.perf.bench import BenchSettings, run_benchmarks
from tests.perf.test_bench import TINY


def test_decode_at_several_batch_sizes(capsys):
    settings = BenchSettings(**{**TINY, "batch_sizes": [1, 2, 4], "label_prompts": 5})
    results = run_benchmarks(["decode"], settings, [48], 1, 0, 1, False)
    entry = results["benchmarks"]["decode"]["lengths"]["48"]
    assert set(entry) == {"batch-1", "batch-2", "batch-4"}
    assert {e["tokens"] for e in entry.values()} == {5 * TINY["decode_tokens"]}  # every variant, same work
    derived = results["benchmarks"]["decode"]["derived"]["48"]
    assert derived["batch-1"]["speedup"] == 1 and derived["batch-4"]["tokens_per_s"] > 0
    assert "| 48 | 4 | 5 | 15 |" in capsys.readouterr().out
