"""experiments/reach/far_kinds.py's paired cells: ``--intervals`` adds the 95 % interval (Newcombe, paired) of the same
McNemar comparison the cell's difference and p come from."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from lkv.eval.stats import mcnemar_exact

REACH = Path(__file__).resolve().parents[2] / "experiments/reach"
sys.path.insert(0, str(REACH))  # the script imports its siblings (analyze, strongest) by name
analyze = importlib.import_module("analyze")
far_kinds = importlib.import_module("far_kinds")


def row(sample: str, method: str, score: float) -> dict:
    meta = {"family": "magic_number", "haystack": "essays", "distribution": "in-distribution"}
    return {
        "task": "needle_id",
        "sample": sample,
        "method": method,
        "budget": "full" if method == "fullkv" else "128",
        "setting": "aware",
        "score": score,
        "meta": meta | {"length": 3072, "depth": 0.1},  # far by depth
    }


def test_intervals_add_the_paired_bounds_and_keep_the_rest_of_the_cell():
    mine = {str(i): float(i < 7) for i in range(10)}  # 7 of 10 kept
    theirs = {str(i): float(i < 2) for i in range(10)}  # 2 of 10: 5 wins, 0 losses
    keys = list(mine)
    plain = analyze.paired_cell(mine, theirs, keys)
    spread = analyze.paired_cell(mine, theirs, keys, interval=True)
    result = mcnemar_exact([mine[k] for k in keys], [theirs[k] for k in keys])
    bounds = f"[{100 * result.low:+.1f}, {100 * result.high:+.1f}]"
    assert plain == "+50.0 (5/0) p=0.062"
    assert spread == f"+50.0 {bounds} (5/0) p=0.062"
    assert result.low < result.high and result.low <= result.diff <= result.high


def test_the_tables_carry_the_interval_only_when_asked():
    rows = [row(str(i), "fullkv", 1.0) for i in range(6)]
    rows += [row(str(i), "lookaheadkv", float(i < 2)) for i in range(6)]
    rows += [row(str(i), "lookaheadkv:copy", float(i < 5)) for i in range(6)]
    methods = ["lookaheadkv", "lookaheadkv:copy"]
    plain = far_kinds.tables(rows, methods, "lookaheadkv", ["128"])
    spread = far_kinds.tables(rows, methods, "lookaheadkv", ["128"], intervals=True)
    assert "+50.0 (3/0) p=0.25" in plain[-2]
    assert "+50.0 [" in spread[-2] and "(3/0) p=0.25" in spread[-2]
    assert "95 % interval (Newcombe, paired)" in "\n".join(
        spread
    ) and "95 % interval (Newcombe, paired)" not in "\n".join(plain)
