"""experiments/reach/strongest.py's ``--versus`` tables: a module against every other method on the same
FullKV-solved pairs, its lead positive and its gap negative, with the same McNemar result's interval."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from lkv.eval.stats import mcnemar_exact

REACH = Path(__file__).resolve().parents[2] / "experiments/reach"
sys.path.insert(0, str(REACH))  # the script imports its siblings (analyze, ruler) by name
strongest = importlib.import_module("strongest")


def rows_of(kept: dict[str, list[int]], solved: int = 10, unsolved: int = 2) -> list[dict]:
    """``solved`` samples FullKV answers and ``unsolved`` it misses; ``kept[method]`` lists the solved samples
    each method still answers (every method misses the unsolved ones)."""
    rows = []
    for i in range(solved + unsolved):
        rows.append(row(i, "fullkv", "full", float(i < solved)))
        for method, answered in kept.items():
            rows.append(row(i, method, "128", float(i in answered)))
    return rows


def row(i: int, method: str, budget: str, score: float) -> dict:
    return {"task": "multi_question", "sample": f"c{i}", "method": method, "budget": budget,
            "setting": "agnostic", "score": score, "meta": {}}  # fmt: skip


def test_versus_sets_the_module_against_every_other_method_on_solved_pairs_only():
    kept = {"lookaheadkv": [0, 1, 2, 3, 4, 5, 6], "kvzip": [0, 1, 7], "snapkv": list(range(10))}
    lines = strongest.kept_tables(rows_of(kept), ("128",), before=None, versus=("lookaheadkv",))
    table = lines[lines.index(next(line for line in lines if line.startswith("`lookaheadkv` against"))) :]
    cells = {line.split(" | ")[0].strip("| "): line.split(" | ")[1].strip(" |") for line in table[4:-1]}
    assert set(cells) == {"kvzip", "snapkv"}  # every other method, never the module itself
    lead = mcnemar_exact(
        [float(i in kept["lookaheadkv"]) for i in range(10)], [float(i in kept["kvzip"]) for i in range(10)]
    )
    assert cells["kvzip"] == f"+40.0 [{100 * lead.low:+.1f}, {100 * lead.high:+.1f}] (5/1) p=0.22"
    assert cells["snapkv"].startswith("-30.0 [") and cells["snapkv"].endswith("(0/3) p=0.25")  # the gap


def test_without_versus_no_such_table_and_an_unknown_module_is_skipped():
    rows = rows_of({"lookaheadkv": [0, 1], "kvzip": [0]})
    assert not any("against each method" in line for line in strongest.kept_tables(rows, ("128",), None))
    lines = strongest.kept_tables(rows, ("128",), None, versus=("lookaheadkv:s9",))
    assert not any("against each method" in line for line in lines)


def test_by_a_meta_key_each_value_is_read_on_its_own_pairs():
    """``--by``: per value, only that value's samples count (here the out-of-source half, where the module
    keeps all and KVzip none)."""
    rows = rows_of({"lookaheadkv": [0, 1, 2, 3, 4, 5], "kvzip": [6, 7, 8, 9]})
    for r in rows:
        r["meta"] = {"source_group": "in-source" if int(r["sample"][1:]) >= 6 else "out-of-source"}
    lines = strongest.split_tables(rows, "source_group", "multi_question, agnostic", ("128",), None, ())
    titles = [line for line in lines if line.startswith("## ")]
    assert titles == [
        "## multi_question, agnostic, source_group = out-of-source",
        "## multi_question, agnostic, source_group = in-source",
    ]
    out = lines[: lines.index(titles[1])]
    assert any(line.startswith("| lookaheadkv ") and "6/6" in line for line in out), out
    assert any(line.startswith("| kvzip ") and "0/6" in line for line in out), out
    assert strongest.split_tables(rows, None, "t", ("128",), None, ()) == []
    assert strongest.split_tables(rows, "fact_kind", "t", ("128",), None, ()) == []  # no row holds it
