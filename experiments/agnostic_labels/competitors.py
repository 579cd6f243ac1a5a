"""The question-agnostic competitors beside LookaheadKV with agnostic labels, paired on the same samples.

    python experiments/agnostic_labels/competitors.py [--competitors experiments/agnostic_labels/competitors]
        [--out experiments/agnostic_labels/results/competitors.md]

``--competitors`` is the ``lkv eval`` folder of
``experiments/agnostic_labels/configs/agnostic_competitors.yaml`` (FullKV, KVzip, Expected Attention, KeyDiff,
the probe); LookaheadKV (agnostic and aware labels), Quest and FullKV come from this study's committed rows
(``results/rows_*_adapter.jsonl``). The samples are regenerated from their seeds, so a sample id names the
same prompt in both; as a check, FullKV's answer must be the same text in both runs, and only samples where it
is are paired (the count is printed in the table's header). Per task and budget: accuracy [Wilson 95 %],
retention of the FullKV-solved samples, and agnostic-label LookaheadKV against the strongest competitor
(highest accuracy among KVzip, Expected Attention, KeyDiff and the probe) and against Quest, exact McNemar.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from compare import AGNOSTIC, AWARE, acc, cells, kept, paired, read_rows

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "experiments/agnostic_labels"
COMPETITORS = ("kvzip", "expected_attention", "keydiff", "probe")


def same_fullkv(committed: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> tuple[set[str], list[str]]:
    """Sample ids whose FullKV answer is the same text in both runs, and those where it differs."""

    def answers(rows: list[dict[str, Any]]) -> dict[str, str]:
        return {
            r["sample"]: r["prediction"]
            for r in rows
            if r["method"] == "fullkv" and r["setting"] == "agnostic"
        }

    old, new = answers(committed), answers(fresh)
    common = set(old) & set(new)
    return {s for s in common if old[s] == new[s]}, sorted(s for s in common if old[s] != new[s])


def table(merged: dict[tuple[str, str, str], dict[str, float]], matched: set[str]) -> list[str]:
    methods = ["quest", AWARE, AGNOSTIC, *COMPETITORS]
    lines = [
        "| task | C | n | FullKV | "
        + " | ".join(methods)
        + " | retention: "
        + " / ".join(methods)
        + " | agnostic − strongest competitor | agnostic − Quest |",
        "|---|---|---|---|" + "---|" * (len(methods) + 3),
    ]

    def get(task: str, method: str, budget: str) -> dict[str, float]:
        scores = merged.get((task, method, budget), {})
        return {s: v for s, v in scores.items() if s in matched}

    for task in sorted({t for t, _, _ in merged}):
        full = get(task, "fullkv", "full")
        solved = [s for s, v in full.items() if v == 1.0]
        budgets = sorted({b for t, m, b in merged if t == task and m == AGNOSTIC}, key=float)
        for budget in budgets:
            got = {m: get(task, m, budget) for m in methods}
            ranked = [m for m in COMPETITORS if got[m]]
            if not ranked:
                continue
            best = max(ranked, key=lambda m: sum(got[m].values()) / len(got[m]))
            lines.append(
                f"| {task} | {budget} | {len(got[AGNOSTIC])} | {acc(full)} | "
                + " | ".join(acc(got[m]) for m in methods)
                + " | "
                + " / ".join(kept(got[m], solved) for m in methods)
                + f" | {paired(got[AGNOSTIC], got[best])} vs {best} | {paired(got[AGNOSTIC], got['quest'])} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--competitors", type=Path, default=HERE / "competitors")
    parser.add_argument("--out", type=Path, default=HERE / "results/competitors.md")
    args = parser.parse_args()
    agnostic = read_rows(HERE / "results/rows_agnostic_adapter.jsonl")
    aware = read_rows(HERE / "results/rows_aware_adapter.jsonl")
    fresh = read_rows(args.competitors / "results.jsonl")
    matched, differ = same_fullkv(agnostic, fresh)
    merged = cells(agnostic, aware)
    for key, scores in cells(fresh, []).items():
        if key[1] in COMPETITORS:
            merged[key] = scores
    lines = [
        "# The question-agnostic competitors, question-agnostic setting",
        "",
        f"Samples paired: {len(matched)} whose FullKV answer is the same text in the committed rows and in "
        f"the competitors' run ({len(differ)} differ{': ' + ', '.join(differ) if differ else ''}).",
        "Accuracy in % [Wilson 95 % interval]; retention = FullKV-solved samples the method also solves;",
        "paired columns: difference in points (wins/losses, exact McNemar p; * = p < 0.05).",
        "",
        *table(merged, matched),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
