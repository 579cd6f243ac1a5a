"""experiments/data_scaling/summarize.py: retention counts only FullKV-solved needles, intervals and paired
tests are the library's, and a sweep folder becomes a table with the baselines beside the points."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from lkv.eval.stats import mcnemar_exact, wilson_interval
from lkv.sweep.grid import point_name

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/data_scaling/summarize.py"
spec = importlib.util.spec_from_file_location("data_scaling_summary", SCRIPT)
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def needle(method: str, sample: int, budget: str, score: float) -> dict:
    return {
        "task": "needle_ood",
        "sample": f"n{sample}",
        "method": method,
        "budget": budget,
        "setting": "aware",
        "score": score,
        "metrics": {},
    }


def importance(method: str, sample: int, recall: float) -> dict:
    return {
        "task": "importance",
        "sample": f"l{sample}",
        "method": method,
        "budget": "-",
        "setting": "aware",
        "score": recall,
        "metrics": {"recall@64": recall},
    }


# FullKV solves n0..n7, fails n8, n9; the method keeps ``kept`` of the solved ones and also "solves" n8
def rows(method: str, kept: int, recall: float) -> list[dict]:
    out = [needle("fullkv", i, "full", float(i < 8)) for i in range(10)]
    out += [needle(method, i, "128", float(i < kept or i == 8)) for i in range(10)]
    return out + [importance(method, i, recall + 0.01 * i) for i in range(4)]


def test_retention_counts_only_what_fullkv_solves():
    data = rows("lookaheadkv", kept=6, recall=0.5)
    solved, answered = summary.fullkv_solved(data)
    assert (len(solved), answered) == (8, 10)
    entries = summary.summarize(summary.method_scores(data, "lookaheadkv", solved))
    assert entries["retention@128"] == pytest.approx((6 / 8, *wilson_interval(6, 8), 8))
    mean, low, high, n = entries["recall@64"]
    assert n == 4 and mean == pytest.approx(0.515) and low <= mean <= high


def test_paired_comparison_is_mcnemar_on_the_solved_needles():
    solved, _ = summary.fullkv_solved(rows("x", 0, 0))
    mine = summary.method_scores(rows("lookaheadkv", kept=7, recall=0.6), "lookaheadkv", solved)
    other = summary.method_scores(rows("snapkv", kept=2, recall=0.4), "snapkv", solved)
    result = summary.compare(mine, other)["retention@128"]
    expected = mcnemar_exact([float(i < 7) for i in range(8)], [float(i < 2) for i in range(8)])
    assert (result.wins, result.losses, result.p) == (5, 0, expected.p)
    assert summary.compare(mine, other)["recall@64"].diff == pytest.approx(0.2)


def test_a_sweep_folder_becomes_a_table_with_baselines(tmp_path, monkeypatch):
    config = {"grid": {summary.SIZE_KEY: [64, 128, 256]}, "overrides": {"trainer.max_steps": 8}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(config))
    for size, kept in ((64, 3), (128, 7)):  # 256 not finished
        folder = tmp_path / "sweep/points" / point_name({summary.SIZE_KEY: size})
        (folder / "eval").mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"fit_s": 60.0}))
        lines = [json.dumps(r) for r in rows("lookaheadkv", kept, 0.5)]
        (folder / "eval/results.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "base").mkdir()
    lines = [json.dumps(r) for r in rows("snapkv", 4, 0.4)]
    (tmp_path / "base/results.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        "summarize",
        "--config",
        str(tmp_path / "sweep.yaml"),
        "--sweep",
        str(tmp_path / "sweep"),
        "--baselines",
        str(tmp_path / "base"),
        "--out",
        str(out),
    ]
    monkeypatch.setattr("sys.argv", argv)
    summary.main()
    text = (out / "summary.md").read_text()
    assert "PARTIAL: points N = [256] not finished" in text
    assert "| 128 | 1 | " in text and "87.5 [" in text and "| snapkv |" in text
    assert "| N = 128 vs N = 64 |" in text and "| N = 64 vs snapkv |" in text
    assert (out / "scaling.png").stat().st_size > 0
    csv_lines = (out / "summary.csv").read_text().splitlines()
    assert len(csv_lines) == 4 and csv_lines[3].startswith(",snapkv,")
