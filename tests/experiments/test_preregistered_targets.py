"""experiments/preregistered/targets.py: PLAN.md's targets read per seed, at their edges."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments/preregistered/targets.py"
spec = importlib.util.spec_from_file_location("preregistered_targets", SCRIPT)
targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(targets)


# what summary.py's tables group by, beside the bin
META = {
    "source_group": "out-of-source",
    "source": "perl-pod",
    "kind_side": "heldout",
    "kind": "badge_code",
    "distance": 3000,
}


def row(sample: str, method: str, budget: str, right: bool, bin_: str) -> dict:
    return {
        "task": "generalise",
        "sample": sample,
        "method": method,
        "budget": budget,
        "setting": "aware",
        "score": float(right),
        "meta": {**META, "bin": bin_},
    }


def rows(
    far: int,
    near: int,
    kept: dict[tuple[str, str, str], int | range],
    methods: tuple[str, ...] = ("oracle", "long", "pooled"),
) -> list[dict]:
    """FullKV-solved needles (``far`` + ``near``, plus one unsolved far one every method keeps), and per
    ``(method, budget, bin)`` the needles of that bin answered right: the first ``k`` for an int, those whose
    index is in the range for a range (every method has a row)."""
    out = [row("unsolved", "fullkv", "full", False, "far")]
    out += [row("unsolved", m, b, True, "far") for m in methods for b in ("128", "256")]
    for bin_, count in (("far", far), ("near", near)):
        for index in range(count):
            sample = f"{bin_}{index}"
            out.append(row(sample, "fullkv", "full", True, bin_))
            for method in methods:
                for budget in ("128", "256"):
                    given = kept.get((method, budget, bin_), 0)
                    right = index in (range(given) if isinstance(given, int) else given)
                    out.append(row(sample, method, budget, right, bin_))
    return out


def verdict(lines: list[tuple[str, str]], start: str) -> str:
    return next(v for name, v in lines if name.startswith(start))


def test_the_share_targets_are_met_at_their_edge_and_missed_below_it():
    kept = {("long", "256", "far"): 80, ("long", "128", "far"): 69, ("oracle", "256", "far"): 80}
    lines = targets.verdicts(rows(100, 10, kept), "long", "pooled")
    assert verdict(lines, "far, C = 256: keeps").startswith("met: 80 of 100 = 80.0 %")
    assert verdict(lines, "far, C = 128: keeps").startswith("missed: 69 of 100 = 69.0 %")


def test_the_oracle_gap_is_read_from_the_paired_intervals_upper_end():
    # 4 points behind the Oracle on 100 needles (4 / 0 discordant): the interval ends at 9.4, under 10
    close = targets.verdicts(
        rows(100, 10, {("oracle", "256", "far"): 90, ("long", "256", "far"): 86}), "long", "pooled"
    )
    assert verdict(close, "far, C = 256: Oracle").startswith("met: +4.0 [-0.7, +9.4], 4 / 0")
    # 8 points behind with 14 / 6 discordant: the point estimate is under 10 but the interval's upper end is not
    mixed = {("oracle", "256", "far"): range(90), ("long", "256", "far"): range(14, 96)}
    far = targets.verdicts(rows(100, 10, mixed), "long", "pooled")
    assert verdict(far, "far, C = 256: Oracle").startswith("missed: +8.0 [-1.0, +17.1], 14 / 6")


def test_near_needles_are_missed_only_when_long_is_worse_beyond_noise():
    level = {("long", "128", "near"): 20, ("pooled", "128", "near"): 20}
    lines = targets.verdicts(rows(10, 30, level), "long", "pooled")
    assert verdict(lines, "near, C = 128").startswith("met: +0.0")
    noisy = targets.verdicts(rows(10, 30, {("pooled", "128", "near"): 3}), "long", "pooled")
    assert verdict(noisy, "near, C = 128").startswith("met: -10.0")  # 0 / 3, p = 0.25
    worse = targets.verdicts(rows(10, 30, {("pooled", "128", "near"): 8}), "long", "pooled")
    assert verdict(worse, "near, C = 128").startswith("missed: -26.7")  # 0 / 8, p = 0.0078


def test_a_method_without_a_row_for_a_screened_needle_is_refused(tmp_path, capsys):
    data = [
        r
        for r in rows(5, 5, {})
        if not (r["method"] == "long" and r["sample"] == "far3" and r["budget"] == "256")
    ]
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    with pytest.raises(
        SystemExit, match=r"targets: long at C = 256 has no row for 1 needle\(s\), e.g. 'far3'"
    ):
        targets.main([str(folder), "--seed", "0=long,pooled"])
    with pytest.raises(SystemExit, match="--seed expects SEED=LONG,POOLED"):
        targets.main([str(folder), "--seed", "0=long"])


def test_the_table_has_a_column_per_seed(tmp_path, capsys):
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(5, 5, {})))
    targets.main([str(folder), "--seed", "0=long,pooled", "--seed", "1=pooled,long"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| target | seed 0 | seed 1 |" and len(out) == 2 + 5


def test_the_committed_analysis_runs_on_the_evaluations_folder(tmp_path):
    """analyse.sh (PLAN.md's analysis) on a folder whose methods are named as configs/eval.yaml names them."""
    methods = ("oracle", "snapkv", "pyramidkv", "keydiff", "expected_attention")
    for seed in ("s0", "s1"):
        long = "lookaheadkv" if seed == "s0" else "lookaheadkv:s1"
        methods += (long, f"lookaheadkv:pooled_{seed}", f"lookaheadkv:paper_{seed}")
    methods += ("probe", "probe:s1")
    data = rows(6, 4, {(m, b, "far"): 3 for m in methods for b in ("128", "256")}, methods)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    script = SCRIPT.parent / "analyse.sh"
    env = {**os.environ, "RESULTS": str(tmp_path), "PYTHON": sys.executable}
    subprocess.run(["bash", str(script)], check=True, env=env, capture_output=True, text=True)
    assert sorted(p.name for p in tmp_path.glob("*.md")) == ["summary.md", "targets.md"]
    assert (tmp_path / "targets.md").read_text().startswith("| target | seed 0 | seed 1 |")
    summary = (tmp_path / "summary.md").read_text()
    for pair in (
        "| lookaheadkv:s1 | probe:s1 |",
        "| lookaheadkv | keydiff |",
        "| lookaheadkv | lookaheadkv:s1 |",
    ):
        assert pair in summary
