"""Question-aware vs question-agnostic labels in the agnostic setting: table with intervals and paired tests.

    python experiments/agnostic_labels/compare.py [--agnostic runs/agnostic_labels/demo/results.jsonl]
        [--aware runs/agnostic_labels/aware/results.jsonl] [--out experiments/agnostic_labels/results]

``--agnostic``: the rows of the run with the agnostic-label adapter (FullKV, LookaheadKV, Quest);
``--aware``: LookaheadKV with the question-aware adapter on the same samples. Per task (in- and
out-of-distribution needles) and budget it reports each method's accuracy (Wilson 95 % interval), its
retention of the samples FullKV solves, and the paired exact McNemar test of agnostic-label LookaheadKV
against aware-label LookaheadKV and against Quest. Writes ``summary.md`` and copies both row files
into ``--out`` (``rows_agnostic_adapter.jsonl``, ``rows_aware_adapter.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from lkv.eval.stats import mcnemar_exact, wilson_interval

ROOT = Path(__file__).resolve().parents[2]
AWARE = "lookaheadkv (aware labels)"
AGNOSTIC = "lookaheadkv (agnostic labels)"


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no result rows (run experiments/agnostic_labels/run.sh first)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cells(agnostic: list[dict[str, Any]], aware: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict]:
    """(task, method, budget) → {sample: 0/1 score}; LookaheadKV's two adapters get their own names."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for rows, lookahead in ((agnostic, AGNOSTIC), (aware, AWARE)):
        for row in rows:
            if row["setting"] != "agnostic" or row["task"].startswith("importance"):
                continue
            method = lookahead if row["method"] == "lookaheadkv" else row["method"]
            if rows is aware and method != AWARE:
                continue  # the other methods come from the agnostic run (same samples)
            out.setdefault((row["task"], method, str(row["budget"])), {})[row["sample"]] = float(row["score"])
    return out


def percent(k: int, n: int) -> str:
    low, high = wilson_interval(k, n)
    return f"{100 * k / n:.1f} [{100 * low:.0f}, {100 * high:.0f}]" if n else "–"


def acc(scores: dict[str, float]) -> str:
    return percent(int(sum(scores.values())), len(scores)) if scores else "–"


def kept(scores: dict[str, float], solved: list[str]) -> str:
    return f"{sum(scores.get(s, 0.0) == 1.0 for s in solved)}/{len(solved)}"


def paired(mine: dict[str, float], other: dict[str, float]) -> str:
    common = sorted(set(mine) & set(other))
    if not common:
        return "–"
    result = mcnemar_exact([mine[s] for s in common], [other[s] for s in common])
    mark = " *" if result.significant else ""
    return f"{100 * result.diff:+.1f} ({result.wins}/{result.losses}, p={result.p:.3f}){mark}"


def summary(table: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    lines = [
        "| task | C | n | FullKV | Quest | LookaheadKV, aware labels | LookaheadKV, agnostic labels "
        "| retention aware / agnostic | agnostic − aware | agnostic − Quest |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    tasks = sorted({t for t, _, _ in table})
    for task in tasks:
        full = next((v for (t, m, _), v in table.items() if t == task and m == "fullkv"), {})
        solved = [s for s, v in full.items() if v == 1.0]
        budgets = sorted({b for t, m, b in table if t == task and m == AGNOSTIC}, key=float)
        for budget in budgets:
            get = {m: table.get((task, m, budget), {}) for m in (AWARE, AGNOSTIC)}
            quest = table.get((task, "quest", budget), {})
            n = len(get[AGNOSTIC])

            lines.append(
                f"| {task} | {budget} | {n} | {acc(full)} | {acc(quest)} | "
                f"{acc(get[AWARE])} | {acc(get[AGNOSTIC])} | {kept(get[AWARE], solved)} / {kept(get[AGNOSTIC], solved)} | "
                f"{paired(get[AGNOSTIC], get[AWARE])} | {paired(get[AGNOSTIC], quest)} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agnostic", type=Path, default=ROOT / "runs/agnostic_labels/demo/results.jsonl")
    parser.add_argument("--aware", type=Path, default=ROOT / "runs/agnostic_labels/aware/results.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments/agnostic_labels/results")
    args = parser.parse_args()
    agnostic, aware = read_rows(args.agnostic), read_rows(args.aware)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.agnostic, args.out / "rows_agnostic_adapter.jsonl")
    shutil.copyfile(args.aware, args.out / "rows_aware_adapter.jsonl")
    lines = [
        "# Question-aware vs question-agnostic labels, question-agnostic setting",
        "",
        "Accuracy in % [Wilson 95 % interval]; retention = FullKV-solved samples the method also solves;",
        "paired columns: difference in points (wins/losses, exact McNemar p; * = p < 0.05).",
        "",
        *summary(cells(agnostic, aware)),
    ]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
