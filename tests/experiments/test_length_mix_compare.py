"""experiments/length_mix/compare.py: retention of FullKV-solved needles per length and pooled, the two
adapters paired on the same samples, the Oracle column where it ran, and a refusal when a folder holds
other samples."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from lkv.eval.stats import mcnemar_exact

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/length_mix/compare.py"
spec = importlib.util.spec_from_file_location("length_mix_compare", SCRIPT)
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)
LENGTH = {i: 1024 if i < 4 else 3072 for i in range(8)}


def row(method: str, sample: int, budget: str, score: float) -> dict:
    keys = {"task": "needle_id", "sample": f"s{sample}", "method": method, "budget": budget}
    return keys | {"setting": "aware", "score": score, "metrics": {}, "meta": {"length": LENGTH[sample]}}


def folder(path: Path, scores: list, fullkv: list, method: str = "lookaheadkv") -> Path:
    """An eval folder; ``None`` scores are samples it did not run."""
    path.mkdir(parents=True)
    rows = [row("fullkv", i, "full", v) for i, v in enumerate(fullkv) if v is not None]
    rows += [row(method, i, "64", v) for i, v in enumerate(scores) if v is not None]
    agnostic = [row(method, i, "64", 1.0) | {"setting": "agnostic"} for i in range(8)]  # never counted
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + agnostic))
    return path


def test_retention_per_length_and_pooled_with_the_oracle_where_it_ran(tmp_path, monkeypatch):
    fullkv = [1.0] * 7 + [0.0]  # sample 7 is not solved: out of every count
    base = folder(tmp_path / "base", [1, 1, 1, 1, 0, 0, 0, 1], fullkv)
    mix = folder(tmp_path / "mix", [1, 1, 1, 0, 1, 1, 1, 0], fullkv)
    oracle = folder(tmp_path / "oracle", [None] * 4 + [1, 1, 0, 1], [None] * 4 + fullkv[4:], "oracle")
    argv = ["compare.py", "--base", str(base), "--mix", str(mix), "--oracle", str(oracle)]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "out")])
    compare.main()
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "| needle_id | 1024 | 64 | 4/4 = 100 % [51, 100] | 3/4 = 75 % [30, 95] | – |" in text
    assert (
        "| needle_id | 3072 | 64 | 0/3 = 0 % [0, 56] | 3/3 = 100 % [44, 100] | 2/3 = 67 % [21, 94] |" in text
    )
    pooled = mcnemar_exact([1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0])
    assert (
        f"| 4/7 = 57 % [25, 84] | 6/7 = 86 % [49, 97] | 2/3 = 67 % [21, 94] | +28.6 (3/1, p={pooled.p:.2g}) |"
        in text
    )
    rows = (tmp_path / "out" / "results" / "lookaheadkv_rows.jsonl").read_text().splitlines()
    assert len(rows) == 16  # the mix's LookaheadKV rows, both settings


def test_folders_of_other_samples_are_refused(tmp_path, monkeypatch):
    base = folder(tmp_path / "base", [1.0] * 8, [1.0] * 8)
    mix = folder(tmp_path / "mix", [1.0] * 8, [1.0] * 7 + [0.0])
    argv = ["compare.py", "--base", str(base), "--mix", str(mix), "--oracle", str(tmp_path / "none")]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="FullKV solves other needles in .*mix than in the base folder"):
        compare.main()
