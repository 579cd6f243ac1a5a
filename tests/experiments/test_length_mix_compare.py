"""experiments/length_mix/compare.py: retention of FullKV-solved needles per length and pooled, the two
adapters paired on the same samples, and a refusal when the two folders hold other samples."""

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


def row(method: str, sample: int, budget: str, score: float, length: int) -> dict:
    keys = {
        "task": "needle_id",
        "sample": f"s{sample}",
        "method": method,
        "budget": budget,
        "setting": "aware",
    }
    return keys | {"score": score, "metrics": {}, "meta": {"length": length}}


def folder(path: Path, lookahead: list[float], fullkv: list[float]) -> Path:
    path.mkdir(parents=True)
    rows = [row("fullkv", i, "full", v, 1024 if i < 4 else 3072) for i, v in enumerate(fullkv)]
    rows += [row("lookaheadkv", i, "64", v, 1024 if i < 4 else 3072) for i, v in enumerate(lookahead)]
    rows += [
        row("lookaheadkv", i, "64", 1.0, 1024) | {"setting": "agnostic"} for i in range(8)
    ]  # not counted
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_retention_counts_fullkv_solved_needles_per_length_and_pooled(tmp_path, monkeypatch, capsys):
    fullkv = [1.0] * 7 + [0.0]  # sample 7 is not solved: out of every count
    base = folder(tmp_path / "base", [1, 1, 1, 1, 0, 0, 0, 1], fullkv)
    mix = folder(tmp_path / "mix", [1, 1, 1, 0, 1, 1, 1, 0], fullkv)
    argv = ["compare.py", "--base", str(base), "--mix", str(mix), "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    compare.main()
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "| needle_id | 1024 | 64 | 4/4 = 100 % [51, 100] | 3/4 = 75 % [30, 95] |" in text
    assert "| needle_id | 3072 | 64 | 0/3 = 0 % [0, 56] | 3/3 = 100 % [44, 100] |" in text
    pooled = mcnemar_exact([1, 1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0])
    assert (
        f"| needle_id | all | 64 | 4/7 = 57 % [25, 84] | 6/7 = 86 % [49, 97] | +28.6 (3/1, p={pooled.p:.2g}) |"
        in text
    )
    rows = (tmp_path / "out" / "results" / "lookaheadkv_rows.jsonl").read_text().splitlines()
    assert len(rows) == 16  # the mix's LookaheadKV rows, both settings


def test_folders_of_other_samples_are_refused(tmp_path, monkeypatch):
    base = folder(tmp_path / "base", [1.0] * 8, [1.0] * 8)
    mix = folder(tmp_path / "mix", [1.0] * 8, [1.0] * 7 + [0.0])
    monkeypatch.setattr(sys, "argv", ["compare.py", "--base", str(base), "--mix", str(mix)])
    with pytest.raises(SystemExit, match="FullKV solves other needles"):
        compare.main()
