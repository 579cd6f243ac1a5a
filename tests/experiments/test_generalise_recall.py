"""experiments/generalise/recall.py: held-out Recall@C of two methods, paired by prompt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/generalise/recall.py"
spec = importlib.util.spec_from_file_location("generalise_recall", SCRIPT)
recall = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recall)


def row(sample: str, method: str, r64: float, r128: float) -> dict:
    return {"task": "importance", "sample": sample, "method": method, "budget": "-",
            "metrics": {"recall@64": r64, "recall@128": r128, "kendall_tau": 0.0}}  # fmt: skip


def test_pairs_count_only_prompts_both_methods_scored():
    rows = [row("p1", "new", 0.8, 0.9), row("p2", "new", 0.6, 0.7), row("p3", "new", 0.1, 0.1)]
    rows += [row("p1", "old", 0.7, 0.9), row("p2", "old", 0.5, 0.7)]
    lines = recall.recall_lines(rows, [("new", "old")])
    # p3 has no "old" row: left out, so the means are over p1 and p2; every resample moves recall@64 by +0.1 (p at its floor, 2 / draws)
    assert lines[2] == "| recall@64 | new | old | 2 | 0.700 | 0.600 | +0.100 [+0.100, +0.100] | 0.001 |"
    assert lines[3].startswith("| recall@128 | new | old | 2 | 0.800 | 0.800 | +0.000 [+0.000, +0.000] |")
    with pytest.raises(ValueError, match="no prompt that both 'new' and 'other' scored"):
        recall.recall_lines(rows, [("new", "other")])
