"""Reach tables of issue 27: what each method keeps by the needle's distance from the end of the prompt.

    python experiments/reach/analyze.py [--tokens FOLDER] [--distance FOLDER] [--reference lookaheadkv]

``--tokens`` is an ``lkv eval`` run of ``experiments/reach/configs/reach_tokens.yaml`` (the prefill-only
needle-token diagnostic), ``--distance`` one of ``experiments/reach/configs/reach_distance.yaml`` (answers
decoded); give either or both. Writes ``tokens.md`` into the ``--tokens`` folder (the share of the value's
tokens kept, mean over samples and (layer, KV head), with a bootstrap interval; and per head: of the heads
where the Oracle keeps the whole value, the share where each method does too) and ``distance.md`` into the
``--distance`` folder (of the needles FullKV solves, the share each method still solves, Wilson 95 %, by
distance; near ≤ 1K and far ≥ 1.5K tokens pooled over prompts ≥ 3K; each method against ``--reference`` paired
on the same needles, exact McNemar).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lkv.eval.results import FULL, RESULTS_FILE, ResultsFile
from lkv.eval.stats import mcnemar_exact, mean_interval, wilson_interval
from lkv.eval.tasks.needle_tokens import held_in_oracle_heads

ROOT = Path(__file__).resolve().parents[2]
NEAR, FAR = 1000, 1500  # tokens from the end: near ≤ 1K, far ≥ 1.5K (issue 27)
FAR_MIN_LENGTH = 3000  # far needles count in prompts of ≥ 3K tokens
BUDGETS = ("64", "128", "256", "512")


def _order(methods: Iterable[str]) -> list[str]:
    preferred = ["fullkv", "oracle", "lookaheadkv"]
    found = list(dict.fromkeys(methods))
    return [m for m in preferred if m in found] + sorted(m for m in found if m not in preferred)


def _pct(low: float, mid: float, high: float) -> str:
    return f"{100 * mid:.0f} [{100 * low:.0f}, {100 * high:.0f}]"


def token_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: needle-token retention by distance, and the Oracle's heads kept by each method."""
    every = [r for r in rows if r["task"].endswith("_tokens")]
    rows = [r for r in every if r["fullkv_score"] == 1.0]  # the needles FullKV finds: the answer needs them
    if not rows:
        return []
    methods = _order(r["method"] for r in rows)
    distances = sorted({r["meta"]["distance"] for r in rows})
    lines = [
        "## Value tokens kept (prefill only)",
        "",
        "Mean over samples of the share of the value's tokens in each (layer, KV head)'s kept set, × 100, with a "
        "bootstrap 95 % interval; in- and out-of-distribution needles pooled; only the needles FullKV finds "
        f"({len({r['sample'] for r in rows})} of {len({r['sample'] for r in every})}); n samples per distance.",
        "",
    ]
    for budget in BUDGETS:
        cells: dict[tuple[str, int], list[float]] = defaultdict(list)
        for r in rows:
            if r["budget"] == budget:
                cells[(r["method"], r["meta"]["distance"])].append(r["score"])
        if not cells:
            continue
        n = {d: len(cells.get((methods[0], d), [])) for d in distances}
        lines += [
            f"**C = {budget}**",
            "",
            "| method | " + " | ".join(f"{d} (n={n[d]})" for d in distances) + " |",
            "|---|" + "---:|" * len(distances),
        ]
        for method in methods:
            values = [cells.get((method, d), []) for d in distances]
            lines.append(f"| {method} | " + " | ".join(_pct(*_mid(v)) if v else "–" for v in values) + " |")
        lines.append("")
    lines += oracle_head_table(rows, methods, distances)
    return lines


def _mid(values: list[float]) -> tuple[float, float, float]:
    low, high = mean_interval(values, binary=False)
    return low, sum(values) / len(values), high


def oracle_head_table(rows: list[dict[str, Any]], methods: list[str], distances: list[int]) -> list[str]:
    """Of the (sample, layer, head) where the Oracle keeps every value token, the share where each method does
    too (the heads the answer reads the value from), by distance."""
    if "oracle" not in methods:
        return []
    by_key = {(r["sample"], r["method"], r["budget"]): r for r in rows}
    lines = [
        "### Where the Oracle keeps the whole value: does the method keep it there too?",
        "",
        "Per distance: (sample, layer, KV head) triples where the Oracle keeps every value token at that "
        "budget (count), and the share of them where the method keeps every value token too, × 100.",
        "",
    ]
    for budget in BUDGETS:
        hits: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        for (sample, _, b), oracle in by_key.items():
            if oracle["method"] != "oracle" or b != budget:
                continue
            distance = oracle["meta"]["distance"]
            for other in methods:
                row = by_key.get((sample, other, budget))
                if row is None:
                    continue
                kept, heads = held_in_oracle_heads(oracle["per_head"], row["per_head"])
                cell = hits[(other, distance)]
                cell[0] += kept
                cell[1] += heads
        if not hits:
            continue
        lines += [
            f"**C = {budget}**",
            "",
            "| method | " + " | ".join(f"{d} ({hits[('oracle', d)][1]} heads)" for d in distances) + " |",
            "|---|" + "---:|" * len(distances),
        ]
        for method in methods:
            if method == "oracle":
                continue
            cells = [hits.get((method, d)) for d in distances]
            lines.append(
                f"| {method} | "
                + " | ".join(
                    f"{100 * k / n:.0f}" if c and (n := c[1]) and (k := c[0]) is not None else "–"
                    for c in cells
                )
                + " |"
            )
        lines.append("")
    return lines


def fullkv_solved(rows: list[dict[str, Any]], setting: str = "aware") -> set[tuple[str, str]]:
    return {
        (r["task"], r["sample"])
        for r in rows
        if r["method"] == "fullkv" and r["budget"] == FULL and r["setting"] == setting and r["score"] == 1.0
    }


def group(meta: dict[str, Any]) -> str | None:
    """``near`` (≤ 1K tokens from the end), ``far`` (≥ 1.5K, in prompts ≥ 3K), or None (neither)."""
    if meta["distance"] <= NEAR:
        return "near"
    if meta["distance"] >= FAR and meta["length"] >= FAR_MIN_LENGTH:
        return "far"
    return None


def solved_outcomes(
    rows: list[dict[str, Any]],
) -> tuple[
    set[tuple[str, str]],
    dict[tuple[str, str], dict[tuple[str, str], float]],
    dict[tuple[str, str], dict[str, Any]],
]:
    """The (task, sample) keys FullKV solves (question-aware), each other method's 0/1 score on them by
    (method, budget), and every sample's ``meta``."""
    solved = fullkv_solved(rows)
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]] = defaultdict(dict)
    meta: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["task"], r["sample"])
        meta[key] = r["meta"]
        if r["method"] != "fullkv" and key in solved:
            outcome[(r["method"], r["budget"])][key] = r["score"]
    return solved, outcome, meta


def distance_tables(rows: list[dict[str, Any]], reference: str) -> list[str]:
    """Markdown: FullKV-solved retention by distance and near/far, and paired tests against ``reference``."""
    rows = [r for r in rows if r["setting"] == "aware" and "distance" in r.get("meta", {})]
    if not rows:
        return []
    solved, outcome, meta = solved_outcomes(rows)
    methods = [m for m in _order(r["method"] for r in rows) if m != "fullkv"]
    distances = sorted({m["distance"] for m in meta.values()})
    total = defaultdict(int)
    for key in meta:
        total[meta[key]["distance"]] += 1
    solved_at = defaultdict(int)
    for key in solved:
        solved_at[meta[key]["distance"]] += 1
    lines = [
        "## End task: FullKV-solved needles still solved",
        "",
        "FullKV solves "
        + ", ".join(f"{solved_at[d]}/{total[d]} at {d}" for d in distances)
        + " (tokens from the end). Cells: kept share × 100 [Wilson 95 %].",
        "",
    ]
    for budget in BUDGETS:
        if not any(b == budget for _, b in outcome):
            continue
        lines += [
            f"**C = {budget}**",
            "",
            "| method | "
            + " | ".join(f"{d}" for d in distances)
            + " | near ≤ 1K | far ≥ 1.5K (prompts ≥ 3K) |",
            "|---|" + "---:|" * (len(distances) + 2),
        ]
        for method in methods:
            scores = outcome.get((method, budget), {})
            cells = []
            for d in distances:
                cells.append(_kept([v for k, v in scores.items() if meta[k]["distance"] == d]))
            for name in ("near", "far"):
                cells.append(_kept([v for k, v in scores.items() if group(meta[k]) == name]))
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += paired_lines(outcome, meta, methods, reference)
    return lines


def _kept(values: list[float]) -> str:
    if not values:
        return "–"
    k, n = int(sum(values)), len(values)
    low, high = wilson_interval(k, n)
    return f"{k}/{n} = {_pct(low, k / n, high)}"


def paired_cell(
    mine: dict[Any, float], theirs: dict[Any, float], keys: list[Any], interval: bool = False
) -> str:
    """``mine`` − ``theirs`` on ``keys`` (0/1 outcomes): points, with ``interval`` its 95 % interval (Newcombe, paired),
    (wins/losses) and the exact McNemar p; bold when p < 0.05; "–" without keys."""
    if not keys:
        return "–"
    result = mcnemar_exact([mine[k] for k in keys], [theirs[k] for k in keys])
    mark = "**" if result.significant else ""
    bounds = f" [{100 * result.low:+.1f}, {100 * result.high:+.1f}]" if interval else ""
    return f"{mark}{100 * result.diff:+.1f}{bounds} ({result.wins}/{result.losses}) p={result.p:.2g}{mark}"


def paired_lines(
    outcome: dict[tuple[str, str], dict[tuple[str, str], float]],
    meta: dict[tuple[str, str], dict[str, Any]],
    methods: list[str],
    reference: str,
) -> list[str]:
    """Each method − ``reference`` on the same FullKV-solved near / far needles: points (wins/losses), p."""
    others = [m for m in methods if m != reference]
    if reference not in methods or not others:
        return []
    lines = [
        f"### Paired against {reference} (same needles, exact McNemar)",
        "",
        "| method | group | " + " | ".join(f"C={b}" for b in BUDGETS) + " |",
        "|---|---|" + "---:|" * len(BUDGETS),
    ]
    for method in others:
        for name in ("near", "far"):
            cells = []
            for budget in BUDGETS:
                mine, theirs = outcome.get((method, budget), {}), outcome.get((reference, budget), {})
                cells.append(
                    paired_cell(mine, theirs, [k for k in mine if k in theirs and group(meta[k]) == name])
                )
            lines.append(f"| {method} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def read(folder: Path) -> list[dict[str, Any]]:
    if not (folder / RESULTS_FILE).is_file():
        return []
    return ResultsFile(folder / RESULTS_FILE).rows


def write_table(folder: Path, name: str, title: str, lines: list[str]) -> None:
    """Write ``lines`` under ``title`` to ``folder / name``; stop when the folder's rows gave no table."""
    if not lines:
        raise SystemExit(f"{folder}: no rows of the kind {name} tabulates in {folder / RESULTS_FILE}")
    (folder / name).write_text("\n".join([f"# {title}", "", *lines]))
    print(f"wrote {folder / name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=Path, help="an lkv eval folder of experiments/reach/configs/reach_tokens.yaml"
    )
    parser.add_argument(
        "--distance", type=Path, help="an lkv eval folder of experiments/reach/configs/reach_distance.yaml"
    )
    parser.add_argument("--reference", default="lookaheadkv")
    args = parser.parse_args(argv)
    if args.tokens is None and args.distance is None:
        parser.error("give --tokens FOLDER, --distance FOLDER or both")
    if args.tokens is not None:
        write_table(args.tokens, "tokens.md", "Reach: value tokens kept", token_tables(read(args.tokens)))
    if args.distance is not None:
        lines = distance_tables(read(args.distance), args.reference)
        write_table(args.distance, "distance.md", "Reach: end task by distance", lines)


if __name__ == "__main__":
    main()
