"""experiments/generalise/summary.py: only FullKV-solved needles count, per grouping of the rows' meta."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/generalise/summary.py"
spec = importlib.util.spec_from_file_location("generalise_summary", SCRIPT)
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)

META = {
    "a": {
        "source_group": "in-source",
        "source": "man-pages",
        "kind_side": "train",
        "kind": "iso_date",
        "bin": "far",
        "distance": 2500,
    },
    "b": {
        "source_group": "in-source",
        "source": "man-pages",
        "kind_side": "heldout",
        "kind": "contact_name",
        "bin": "near",
        "distance": 1024,
    },
    "c": {
        "source_group": "out-of-source",
        "source": "c-headers",
        "kind_side": "train",
        "kind": "iso_date",
        "bin": "far",
        "distance": 1536,
    },
}


def row(sample: str, method: str, budget: str, score: float, task: str = "generalise") -> dict:
    return {
        "task": task,
        "sample": sample,
        "method": method,
        "budget": budget,
        "setting": "aware",
        "score": score,
        "meta": META[sample],
    }


def test_kept_counts_only_fullkv_solved_needles_per_group():
    rows = [
        row("a", "fullkv", "full", 1.0),
        row("b", "fullkv", "full", 1.0),
        row("c", "fullkv", "full", 0.0),
        row("a", "snapkv", "128", 1.0),
        row("b", "snapkv", "128", 0.0),
        row("c", "snapkv", "128", 1.0),
        row("a", "fullkv", "full", 0.0, task="needle_ood"),
    ]
    lines = summary.kept_tables(rows)
    assert lines[0].startswith("FullKV solved 2 needles (aware)")
    assert (
        "| in-source | 2 | 1/2 = 50 % [9, 91] |" in lines
    )  # c is not solved: its kept answer is not counted
    assert "| far | 1 | 1/1 = 100 % [21, 100] |" in lines and "| near | 1 | 0/1 = 0 % [0, 79] |" in lines
    assert not any(line.startswith("| out-of-source") for line in lines)
    with pytest.raises(ValueError, match="no generalise sample that FullKV solved in setting 'agnostic'"):
        summary.kept_tables(rows, "agnostic")


def test_each_method_is_paired_against_lookaheadkv_per_group_and_distance():
    rows = [row(s, "fullkv", "full", 1.0) for s in "abc"]
    rows += [row("a", "lookaheadkv", "128", 1.0), row("c", "lookaheadkv", "128", 1.0)]
    rows += [row("a", "oracle", "128", 0.0), row("c", "oracle", "128", 1.0), row("b", "oracle", "128", 1.0)]
    lines = summary.kept_tables(rows)
    assert "| source_group × bin | solved | lookaheadkv C=128 | oracle C=128 |" in lines
    assert "| in-source / far | 1 | 1/1 = 100 % [21, 100] | 0/1 = 0 % [0, 79] |" in lines
    # in-source far: lookaheadkv keeps a, the Oracle does not; the near needle b has no lookaheadkv row
    assert "| in-source / far | 128 | oracle | 1 | -100 | 1 / 0 | 1 |" in lines
    assert "| out-of-source / far | 128 | oracle | 1 | +0 | 0 / 0 | 1 |" in lines
    assert not any(line.startswith("| in-source / near | 128 | oracle") for line in lines)


def test_folders_merge_by_sample_and_refuse_a_fullkv_disagreement_or_a_method_twice():
    first = [row(s, "fullkv", "full", 1.0) for s in "ab"] + [row("a", "lookaheadkv", "128", 1.0)]
    second = [row(s, "fullkv", "full", 1.0) for s in "ab"] + [row("a", "lookaheadkv:mix", "128", 0.0)]
    merged = summary.merged_rows([first, second])
    assert [r["method"] for r in merged] == ["fullkv", "fullkv", "lookaheadkv", "lookaheadkv:mix"]
    lines = summary.kept_tables(merged, reference="lookaheadkv:mix")
    assert "| in-source / far | 128 | lookaheadkv | 1 | +100 | 0 / 1 | 1 |" in lines
    changed = [dict(r, score=0.0) if r["sample"] == "b" and r["method"] == "fullkv" else r for r in second]
    with pytest.raises(ValueError, match="folder 2: FullKV's row for sample 'b' differs from folder 1's"):
        summary.merged_rows([first, changed])
    with pytest.raises(ValueError, match="method 'lookaheadkv' has rows in folders 1 and 2"):
        summary.merged_rows([first, first])
    both = summary.merged_rows([first, summary.renamed(first, "s1")])
    assert [r["method"] for r in both] == ["fullkv", "fullkv", "lookaheadkv", "lookaheadkv@s1"]


def test_distance_bands_split_far_needles_at_the_plans_edges():
    assert [summary.distance_band(d) for d in (0, 1024, 1025, 1535, 1536, 2499, 2500, 3999, 4000, 7600)] == [
        "near ≤1K",
        "near ≤1K",
        "mid 1–1.5K",
        "mid 1–1.5K",
        "1.5–2.5K",
        "1.5–2.5K",
        "2.5–4K",
        "2.5–4K",
        "4–7.5K",
        "4–7.5K",
    ]
    rows = [row(s, "fullkv", "full", 1.0) for s in "abc"] + [row(s, "snapkv", "128", 1.0) for s in "ac"]
    lines = summary.kept_tables(rows)
    assert (
        "| 2.5–4K | 1 | 1/1 = 100 % [21, 100] |" in lines
        and "| 1.5–2.5K | 1 | 1/1 = 100 % [21, 100] |" in lines
    )


def test_preset_figures_count_kept_needles_per_seed_and_source_group():
    rows = [row(s, "fullkv", "full", 1.0) for s in "abc"]
    rows += [row("a", "mix", "128", 1.0), row("a", "mix", "256", 1.0), row("c", "mix", "128", 0.0)]
    rows += [row("c", "mix", "256", 1.0), row("b", "mix", "128", 1.0), row("b", "mix", "256", 0.0)]
    rows += [row("c", "oracle", "128", 1.0), row("a", "oracle", "128", 1.0)]
    assert (
        summary.preset_figures(rows, {0: "other"}, "general")[0]["in_source"]["far_n"] == 0
    )  # no rows: no n
    figures = summary.preset_figures(rows, {0: "mix"}, "general")
    assert figures == [
        {
            "seed": 0,
            "preset": "general",
            "method": "mix",
            "out_of_source": {
                "far_n": 1,
                "far_kept_128": 0,
                "far_kept_256": 1,
                "near_n": 0,
                "near_kept_128": 0,
                "oracle_far_kept_128": 1,
            },
            "in_source": {
                "far_n": 1,
                "far_kept_128": 1,
                "far_kept_256": 1,
                "near_n": 1,
                "near_kept_128": 1,
                "oracle_far_kept_128": 1,
            },
        }
    ]


def test_summary_json_matches_the_committed_rows():
    """experiments/generalise/summary.json is what preset_figures gives on the committed dev folders."""
    from lkv.eval.results import ResultsFile

    study = SCRIPT.parent
    figures = json.loads((study / "summary.json").read_text())
    folders = [
        ResultsFile(study / "results" / "dev" / "results.jsonl").rows,
        summary.renamed(ResultsFile(study / "results" / "dev_mix" / "results.jsonl").rows, "mix"),
        summary.renamed(ResultsFile(study / "results" / "full" / "results.jsonl").rows, "full"),
    ]
    methods = {entry["seed"]: entry["method"] for entry in figures}
    assert len(methods) >= 2, "the preset's figures are per seed, two seeds at least"
    assert summary.preset_figures(summary.merged_rows(folders), methods, figures[0]["preset"]) == figures


def test_named_pairs_test_each_pair_per_cell_on_the_needles_both_kept_rows_for():
    rows = [row(s, "fullkv", "full", 1.0) for s in "ab"] + [row("c", "fullkv", "full", 0.0)]
    rows += [row("a", "mix", "128", 1.0), row("b", "mix", "128", 1.0), row("c", "mix", "128", 1.0)]
    rows += [row("a", "long", "128", 0.0), row("b", "long", "128", 1.0), row("c", "long", "128", 0.0)]
    lines = summary.named_pairs(rows, "aware", ["mix=long"])
    # c is not FullKV-solved: mix's kept answer there counts nowhere; 1 win of 1 discordant
    assert "| all | 128 | mix | long | 2 | 2 | 1 | +50 [-27, +91] | 1 / 0 | 1 |" in lines
    assert "| far | 128 | mix | long | 1 | 1 | 0 | +100 [-12, +100] | 1 / 0 | 1 |" in lines
    assert "| in-source / near | 128 | mix | long | 1 | 1 | 1 | +0 [-79, +79] | 0 / 0 | 1 |" in lines
    assert "| heldout | 128 | mix | long | 1 | 1 | 1 | +0 [-79, +79] | 0 / 0 | 1 |" in lines
    assert not any("out-of-source" in line for line in lines)
    with pytest.raises(ValueError, match=r"--pair: no rows of method\(s\) \['short'\]"):
        summary.named_pairs(rows, "aware", ["mix=short"])
    with pytest.raises(ValueError, match="--pair: expected METHOD_A=METHOD_B"):
        summary.named_pairs(rows, "aware", ["mix"])
