"""experiments/compress_once/goal.py: PLAN.md's goal cells, their competitor, Holm's adjustment and the words."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/compress_once/goal.py"
spec = importlib.util.spec_from_file_location("compress_once_goal", SCRIPT)
goal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(goal)


def rows(outcomes: dict[str, list[int]], budget: str = "0.5", group: str = "in-source") -> list[dict]:
    """FullKV right on every question; each method's 0/1 outcomes per question at ``budget``."""
    n = len(next(iter(outcomes.values())))
    out = [row(f"q{i}-{group}", "fullkv", "full", 1, group) for i in range(n)]
    out.append(row(f"unsolved-{group}", "fullkv", "full", 0, group))  # never counted
    for method, scores in outcomes.items():
        out += [row(f"q{i}-{group}", method, budget, s, group) for i, s in enumerate(scores)]
        out.append(row(f"unsolved-{group}", method, budget, 1, group))
    return out


def row(sample: str, method: str, budget: str, score: int, group: str) -> dict:
    return {
        "task": "multi_question",
        "sample": sample,
        "method": method,
        "budget": budget,
        "setting": "agnostic",
        "score": float(score),
        "meta": {"source_group": group},
    }


def test_holm_matches_the_step_down_by_hand():
    assert goal.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert goal.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1, never below an earlier rank


def test_the_competitor_is_the_best_non_module_and_the_words_follow_the_plan():
    n = 40
    outcomes = {
        "lookaheadkv": [1] * 30 + [0] * 10,
        "lookaheadkv:nosent_s0": [1] * n,  # a module: never the competitor
        "oracle": [1] * n,  # the upper bound: never the competitor
        "kvzip": [1] * 10 + [0] * 30,
        "probe": [1] * 20 + [0] * 20,
    }
    ((module, budget, rival, test),) = goal.cells(rows(outcomes), ["lookaheadkv"], ["0.5"])
    assert (module, budget, rival, test.n) == ("lookaheadkv", "0.5", "probe", n)
    assert (test.wins, test.losses) == (10, 0) and goal.reading(test) == "a lead"
    outcomes["probe"] = [1] * 34 + [0] * 6
    ((*_, test),) = goal.cells(rows(outcomes), ["lookaheadkv"], ["0.5"])
    assert (test.wins, test.losses) == (0, 4) and goal.reading(test).startswith(
        "within noise: no gap larger than"
    )
    outcomes["probe"] = [1] * n
    found = goal.cells(rows(outcomes), ["lookaheadkv"], ["0.5"])
    lines = goal.table(found)
    assert (
        "| a gap |" in lines[2]
        and "| no |" in lines[2]
        and goal.goal(found).startswith("Goal: does not hold")
    )


def test_a_missing_row_is_refused(tmp_path):
    found = rows({"lookaheadkv": [1, 1, 0], "probe": [1, 0, 0]})
    found = [r for r in found if not (r["method"] == "probe" and r["sample"] == "q2-in-source")]
    with pytest.raises(ValueError, match="no row for 1 FullKV-solved"):
        goal.cells(found, ["lookaheadkv"], ["0.5"])


def test_the_command_reads_a_folder_and_splits_by_a_meta_key(tmp_path):
    both = rows({"lookaheadkv": [1] * 8, "probe": [0] * 8}) + rows(
        {"lookaheadkv": [0] * 8, "probe": [1] * 8}, group="out-of-source"
    )
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in both))
    args = [str(tmp_path), "--modules", "lookaheadkv", "--budgets", "0.5", "--by", "source_group"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True
    ).stdout
    assert "| lookaheadkv | 0.5 | probe | 16 | +0.0" in out and "Goal: holds" in out
    parts = out.split("source_group = ")
    assert "| 8 | +100.0" in parts[1] and "| 8 | -100.0" in parts[2] and "Goal" not in parts[1] + parts[2]
    tables = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--no-goal"], capture_output=True, text=True, check=True
    ).stdout
    assert "Goal" not in tables and tables.count("| lookaheadkv | 0.5 | probe |") == 3


def test_tasks_keeps_only_the_named_tasks_rows(tmp_path):
    """A FullKV-solved question of a task no method ran is refused, unless ``--tasks`` leaves its task out."""
    found = rows({"lookaheadkv": [1] * 8, "probe": [0] * 8})
    found.append({**row("q-other", "fullkv", "full", 1, "in-source"), "task": "vt"})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    args = [sys.executable, str(SCRIPT), str(tmp_path), "--modules", "lookaheadkv", "--budgets", "0.5"]
    refused = subprocess.run(args, capture_output=True, text=True)
    assert refused.returncode != 0 and "no row for 1 FullKV-solved" in refused.stderr
    out = subprocess.run(
        [*args, "--tasks", "multi_question"], capture_output=True, text=True, check=True
    ).stdout
    assert "| lookaheadkv | 0.5 | probe | 8 | +100.0" in out
