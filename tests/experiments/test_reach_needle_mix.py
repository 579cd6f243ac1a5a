"""experiments/reach/needle_mix.py: what the FullKV-solved needles of pooled folders are made of, by place,
with the measured distance range that shows where the nominal near/far split is loose."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

REACH = Path(__file__).resolve().parents[2] / "experiments/reach"
sys.path.insert(0, str(REACH))  # the script imports its siblings (analyze, far_kinds, strongest) by name
needle_mix = importlib.import_module("needle_mix")


def row(sample: str, method: str, score: float, setting: str = "aware", **meta: object) -> dict:
    base = {"family": "magic_number", "haystack": "essays", "distribution": "in-distribution", "length": 3072}
    return {
        "task": "needle_id",
        "sample": sample,
        "method": method,
        "budget": "full" if method == "fullkv" else "128",
        "setting": setting,
        "score": score,
        "meta": base | meta,
    }


def test_solved_needles_are_counted_by_place_with_their_measured_distance(tmp_path):
    rows = [
        row("a", "fullkv", 1.0, depth=0.1, needle_distance=2700, docs=["e/worked", "e/wisdom"]),
        row(
            "b",
            "fullkv",
            1.0,
            depth=0.5,
            needle_distance=1394,
            haystack="pydoc",
            docs=["p/json"],
            distribution="out-of-distribution",
        ),
        row("c", "fullkv", 1.0, depth=0.9, needle_distance=1098, docs=["e/worked"], length=5120),
        row("d", "fullkv", 0.0, depth=0.1, needle_distance=2900, docs=["e/rss"]),  # unsolved: not counted
        row("e", "fullkv", 1.0, depth=0.6, needle_distance=1200, docs=["e/rss"]),  # between near and far
        row("f", "fullkv", 1.0, setting="agnostic", depth=0.1, needle_distance=2800, docs=["e/ecw"]),
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = needle_mix.mix_table(needle_mix.merged([str(tmp_path)]), "e/worked")
    assert lines[2] == "| far | 2 | essays 1, pydoc 1 | essays 2, pydoc 1 | 1 | 3072 (2) | 1 | 1394–2700 |"
    assert lines[3] == "| near | 1 | essays 1 | essays 1 | 1 | 5120 (1) | 1 | 1098–1098 |"
    assert len(lines) == 5 and lines[4] == ""
