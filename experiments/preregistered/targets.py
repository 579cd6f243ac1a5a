"""The targets of experiments/preregistered/PLAN.md, per seed, each "met" or "missed" with its numbers.

    python experiments/preregistered/targets.py experiments/preregistered/results/eval \
        --seed 0=lookaheadkv,lookaheadkv:pooled_s0 --seed 1=lookaheadkv:s1,lookaheadkv:pooled_s1

Folders merge as in experiments/generalise/summary.py (FOLDER@NAME renames a folder's methods; FullKV must agree).
Only FullKV-solved needles count. ``--seed SEED=LONG,POOLED`` names a seed's `long` and `pooled` methods; the
Oracle is ``oracle``. The targets, as PLAN.md fixes them:

- far, C = 256: `long` keeps ≥ 80 % (the point estimate; Wilson 95 % beside it);
- far, C = 128: `long` keeps ≥ 70 %;
- far, C = 256: Oracle − `long` below 10 points by the paired test (the upper end of the exact McNemar 95 %
  interval of the difference is below 0.10);
- near, C = 128 and 256: `long` keeps at least as many as `pooled`, or the exact McNemar test has p ≥ 0.05.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generalise"))
from summary import TASK, folder_rows, merged_rows  # noqa: E402

from lkv.eval.paired import fullkv_solved  # noqa: E402
from lkv.eval.stats import mcnemar_exact, wilson_interval  # noqa: E402

ORACLE = "oracle"
SHARE_TARGETS = (("256", 0.80), ("128", 0.70))  # (budget, least share of far needles kept)
ORACLE_GAP = 0.10  # the paired interval's upper end must be below it
NOISE_P = 0.05


def outcomes(rows: Sequence[dict[str, Any]], method: str, budget: str, samples: list[str]) -> list[float]:
    """1.0 / 0.0 per sample of ``samples``: whether ``method`` at ``budget`` answered it right; a missing row is an
    error (every method of the plan runs on every screened needle)."""
    scores = {r["sample"]: r["score"] for r in rows if r["method"] == method and r["budget"] == budget}
    missing = [s for s in samples if s not in scores]
    if missing:
        raise ValueError(
            f"{method} at C = {budget} has no row for {len(missing)} needle(s), e.g. {missing[0]!r}"
        )
    return [float(scores[s] == 1.0) for s in samples]


def verdicts(rows: Sequence[dict[str, Any]], long: str, pooled: str) -> list[tuple[str, str]]:
    """``(target, verdict)`` lines of one seed (module docstring), each verdict starting with "met" or "missed"."""
    solved = fullkv_solved(rows, TASK, "aware")
    mine = [r for r in rows if r["task"] == TASK and r["setting"] == "aware" and r["sample"] in solved]
    meta = {r["sample"]: r["meta"] for r in mine}
    far = sorted(s for s in meta if meta[s]["bin"] == "far")
    near = sorted(s for s in meta if meta[s]["bin"] == "near")
    lines = []
    for budget, least in SHARE_TARGETS:
        kept = sum(outcomes(mine, long, budget, far))
        low, high = wilson_interval(int(kept), len(far))
        share = kept / len(far)
        word = "met" if share >= least else "missed"
        lines.append(
            (
                f"far, C = {budget}: keeps ≥ {100 * least:.0f} %",
                f"{word}: {kept:.0f} of {len(far)} = {100 * share:.1f} % [{100 * low:.0f}, {100 * high:.0f}]",
            )
        )
    test = mcnemar_exact(outcomes(mine, ORACLE, "256", far), outcomes(mine, long, "256", far))
    word = "met" if test.high < ORACLE_GAP else "missed"
    lines.append(
        (
            f"far, C = 256: Oracle − long < {100 * ORACLE_GAP:.0f} points (paired)",
            f"{word}: {100 * test.diff:+.1f} [{100 * test.low:+.1f}, {100 * test.high:+.1f}], "
            f"{test.wins} / {test.losses}, p = {test.p:.2g}, n = {test.n}",
        )
    )
    for budget in ("128", "256"):
        test = mcnemar_exact(outcomes(mine, long, budget, near), outcomes(mine, pooled, budget, near))
        word = "met" if test.diff >= 0 or test.p >= NOISE_P else "missed"
        lines.append(
            (
                f"near, C = {budget}: long not worse than pooled beyond noise",
                f"{word}: {100 * test.diff:+.1f} [{100 * test.low:+.1f}, {100 * test.high:+.1f}], "
                f"{test.wins} / {test.losses}, p = {test.p:.2g}, n = {test.n}",
            )
        )
    return lines


def table(rows: Sequence[dict[str, Any]], seeds: dict[str, tuple[str, str]]) -> list[str]:
    """Markdown lines: a row per target, a column per seed."""
    per_seed = {seed: verdicts(rows, long, pooled) for seed, (long, pooled) in seeds.items()}
    names = [target for target, _ in next(iter(per_seed.values()))]
    lines = [
        "| target | " + " | ".join(f"seed {seed}" for seed in per_seed) + " |",
        "|---|" + "---|" * len(per_seed),
    ]
    for index, name in enumerate(names):
        lines.append(f"| {name} | " + " | ".join(v[index][1] for v in per_seed.values()) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folders", nargs="+", help="lkv eval folders of the screened needles (FOLDER@NAME renames)"
    )
    parser.add_argument(
        "--seed", action="append", required=True, metavar="SEED=LONG,POOLED", help="a seed's two method names"
    )
    args = parser.parse_args(argv)
    seeds = {}
    for given in args.seed:
        seed, _, names = given.partition("=")
        methods = names.split(",")
        if not seed or len(methods) != 2 or not all(methods):
            sys.exit(f"targets: --seed expects SEED=LONG,POOLED, got {given!r}")
        seeds[seed] = (methods[0], methods[1])
    try:
        print("\n".join(table(merged_rows([folder_rows(f, "targets") for f in args.folders]), seeds)))
    except ValueError as error:
        sys.exit(f"targets: {error}")


if __name__ == "__main__":
    main()
