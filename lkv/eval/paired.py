"""Paired comparisons of ``lkv eval`` rows: every method against FullKV and against the best training-free
eviction baseline of the same cell, on the same samples.

A comparison pairs the rows of two methods by sample id within one (task, setting, budget); FullKV has one
row per sample and setting, compared at every budget. A trained method (LookaheadKV) is also compared with
every training-free baseline, one by one: the claim "beats every baseline" needs each test, not only the
best's. 0/1 scores get the exact McNemar test, continuous ones the paired bootstrap (:mod:`lkv.eval.stats`).
The *best training-free baseline* of a cell is the eviction method with the highest mean there among those
that are neither trained (LookaheadKV, the per-token probe), nor an upper bound (Oracle), nor keep the whole
cache (FullKV, Quest). The *strongest competitor* of a lookahead module is the highest among the baselines and
the other trained methods (the probe); a module is compared with it too where it is not the best baseline.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lkv.eval.results import FULL, NO_BUDGET, RESULTS_FILE, ResultsFile, budget_order
from lkv.eval.stats import ALPHA, PairedResult, is_binary, paired_test, wilson_interval
from lkv.eviction.roles import REFERENCE, Roles, roles_of


def is_baseline(roles: Roles) -> bool:
    """A training-free eviction baseline: not the reference nor the upper bound, needs no trained module
    (lookahead adapter, probe), and it evicts (Quest keeps the whole cache)."""
    return roles.role == "method" and not roles.requires and roles.evicts


def is_competitor(roles: Roles) -> bool:
    """What a lookahead module competes with: an evicting method that is not a lookahead module (the
    training-free baselines and the trained per-token probe)."""
    return roles.role == "method" and roles.requires != "adapter" and roles.evicts


def _cells(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """(task, setting, method, budget) → {sample id: score}, end-task rows only."""
    cells: dict[tuple[str, str, str, str], dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row["budget"] != NO_BUDGET:
            cells[(row["task"], row["setting"], row["method"], row["budget"])][row["sample"]] = row["score"]
    return cells


def fullkv_solved(rows: Sequence[dict[str, Any]], task: str, setting: str) -> set[str]:
    """Samples of ``task`` in ``setting`` that FullKV answered right (score 1): the *solved* samples on which
    the paired comparisons count what a method *kept*, and what a screened task keeps (a needle the
    full-cache model cannot retrieve measures the model, not the eviction)."""
    return _solved(_cells(rows).get((task, setting, REFERENCE, FULL), {}))


def solved_in(
    folder: str | Path, cells: Iterable[tuple[str, str]], flag: str
) -> tuple[Path, dict[tuple[str, str], frozenset[str]], list[dict[str, Any]]]:
    """The results file of ``folder`` (or that file itself); per (task, setting) of ``cells``, the samples
    FullKV solved there: what a screened run keeps; and that file's rows, whose ``meta`` names the prompt each
    sample id was scored on (:func:`~lkv.eval.results.check_same_samples`). ``flag`` names the option that
    asked, in the errors.

    Raises:
        FileNotFoundError: no results file there.
        ValueError: a (task, setting) with no FullKV row there (naming each), since an unscreened cell would
            otherwise keep no sample at all.
    """
    path = Path(folder)
    path = path / RESULTS_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"{flag}: no {RESULTS_FILE} at {path} (run FullKV there first)")
    rows = ResultsFile(path).rows
    have = {(r["task"], r["setting"]) for r in rows if r["method"] == REFERENCE}
    cells = list(dict.fromkeys(cells))
    missing = [f"{task!r} ({setting})" for task, setting in cells if (task, setting) not in have]
    if missing:
        raise ValueError(f"{flag} {path}: no FullKV row of task {', '.join(missing)} to screen by")
    solved = {(task, setting): frozenset(fullkv_solved(rows, task, setting)) for task, setting in cells}
    return path, solved, rows


def _solved(full: dict[str, float]) -> set[str]:
    return {sample for sample, score in full.items() if score == 1.0}


def pair_by_sample(mine: dict[str, float], other: dict[str, float], seed: int = 0) -> PairedResult | None:
    """The paired test of two {sample id: score} maps on their common samples; None if they share none."""
    common = sorted(set(mine) & set(other))
    if not common:
        return None
    return paired_test([mine[s] for s in common], [other[s] for s in common], seed=seed)


def paired_comparisons(rows: Sequence[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """One entry per (task, setting, budget, method, reference) with reference ``fullkv``, the best baseline,
    and for the trained lookahead modules (:class:`~lkv.eviction.roles.Roles` ``requires="adapter"``) also
    the strongest competitor (where it is not the best baseline) and each baseline.

    Entry keys: task, setting, budget, method, reference (``fullkv``, ``best baseline``, ``strongest
    competitor`` or ``baseline``),
    baseline (the reference method's name), the :class:`~lkv.eval.stats.PairedResult` fields (n, diff, low,
    high, wins, losses, p, test), ``significant``, and for 0/1 tasks against FullKV ``solved`` (samples
    FullKV got right) and ``kept`` (of those, the ones the method also got right).
    """
    cells = _cells(rows)
    out: list[dict[str, Any]] = []
    keys = dict.fromkeys((t, s, b) for t, s, _, b in cells if b != FULL)
    for task, setting, budget in keys:
        full = cells.get((task, setting, REFERENCE, FULL), {})
        methods = [m for t, s, m, b in cells if (t, s, b) == (task, setting, budget)]
        means = {m: _mean(cells[(task, setting, m, budget)].values()) for m in methods}
        baselines = [m for m in methods if is_baseline(roles_of(m))]
        best = max(baselines, key=lambda m: (means[m], m)) if baselines else None
        competitors = [m for m in methods if is_competitor(roles_of(m))]
        strongest = max(competitors, key=lambda m: (means[m], m)) if competitors else None
        for method in methods:
            mine = cells[(task, setting, method, budget)]
            references = [(REFERENCE, REFERENCE), ("best baseline", best)]
            if roles_of(method).requires == "adapter":
                if strongest != best:
                    references.append(("strongest competitor", strongest))
                references += [("baseline", name) for name in sorted(baselines)]
            for reference, name in references:
                if name is None or name == method:
                    continue
                other = full if reference == REFERENCE else cells[(task, setting, name, budget)]
                result = pair_by_sample(mine, other, seed)
                if result is None:
                    continue
                entry: dict[str, Any] = {
                    "task": task,
                    "setting": setting,
                    "budget": budget,
                    "method": method,
                    "reference": reference,
                    "baseline": name,
                    **vars(result),
                    "significant": result.significant,
                }
                if reference == REFERENCE and is_binary(list(full.values())):
                    solved = [s for s in _solved(full) if s in mine]
                    entry["solved"] = len(solved)
                    entry["kept"] = sum(mine[s] == 1.0 for s in solved)
                out.append(entry)
    return out


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def _signed(value: float) -> str:
    return f"{100 * value:+.1f}"


def comparison_markdown(comparisons: Sequence[dict[str, Any]], methods: Sequence[str] = ()) -> list[str]:
    """Markdown lines: per task and setting a table (method vs reference × budget) and a sentence per method
    naming the budgets where its difference is outside noise (p < 0.05) and the ones where it is not."""
    if not comparisons:
        return []
    baselines = sorted({c["baseline"] for c in comparisons if c["reference"] == "best baseline"})
    # a run with no training-free baseline (e.g. modules, a probe and FullKV only) has no best-baseline rows
    against = (
        "and against the best training-free eviction baseline of the same cell (highest mean among "
        f"{', '.join(baselines)}), "
        if baselines
        else ""
    )
    lines = [
        "## Paired comparisons",
        "",
        f"Each method against FullKV {against}on the same samples. Cells: difference in points (wins/losses) "
        "and the two-sided p-value: "
        "exact McNemar for 0/1 scores, paired bootstrap otherwise; **bold** = outside noise (p < "
        f"{ALPHA:g}). Against FullKV, 0/1 tasks also give *kept*: FullKV-solved samples the method still "
        "solves, with the share's Wilson interval. A lookahead module is also compared with each "
        "training-free baseline (rows named after it) and, where a trained competitor (the per-token probe) "
        "beats every baseline, with that *strongest competitor*.",
        "",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for entry in comparisons:
        groups[(entry["task"], entry["setting"])].append(entry)
    for (task, setting), entries in groups.items():
        budgets = sorted({e["budget"] for e in entries}, key=budget_order)
        by_key = {(e["method"], _versus(e), e["budget"]): e for e in entries}
        found = list(dict.fromkeys(e["method"] for e in entries))
        order = [m for m in methods if m in found] + [m for m in found if m not in methods]
        lines += [f"**{task}**, {setting}: paired differences (points)", ""]
        lines.append("| method | vs | " + " | ".join(f"C={b}" for b in budgets) + " |")
        lines.append("|---|---|" + "---:|" * len(budgets))
        words: list[str] = []
        for method in order:
            versus = list(dict.fromkeys(_versus(e) for e in entries if e["method"] == method))
            for reference in versus:
                chosen = [by_key.get((method, reference, b)) for b in budgets]
                lines.append(f"| {method} | {reference} | " + " | ".join(_cell(e) for e in chosen) + " |")
                words.append(_sentence(method, reference, [e for e in chosen if e is not None]))
            each = [e for e in entries if e["method"] == method and e["reference"] == "baseline"]
            if each:
                words.append(_every_baseline_sentence(method, each, budgets))
        lines += ["", *(f"- {w}" for w in words), ""]
    return lines


def _versus(entry: dict[str, Any]) -> str:
    """The comparison's row label: ``fullkv``, ``best baseline``, ``strongest competitor``, or the baseline's
    name (one by one)."""
    return entry["baseline"] if entry["reference"] == "baseline" else entry["reference"]


def _every_baseline_sentence(method: str, entries: list[dict[str, Any]], budgets: list[str]) -> str:
    """'lookaheadkv vs every training-free baseline (pyramidkv, snapkv): beats each outside noise at C=64, 128;
    not at C=512 (snapkv: +5.0, p=0.41).' Budgets where some baseline is not beaten name those baselines."""
    names = sorted({e["baseline"] for e in entries})
    beaten, not_beaten = [], []
    for budget in budgets:
        at = [e for e in entries if e["budget"] == budget]
        if not at:
            continue
        short = [e for e in at if not (e["significant"] and e["diff"] > 0)]
        if short:
            detail = ", ".join(f"{e['baseline']}: {_signed(e['diff'])}, p={e['p']:.2g}" for e in short)
            not_beaten.append(f"C={budget} ({detail})")
        else:
            beaten.append(budget)
    parts = [f"beats each outside noise at C={', '.join(beaten)}"] if beaten else []
    if not_beaten:
        parts.append("not at " + "; ".join(not_beaten))
    return f"{method} vs every training-free baseline ({', '.join(names)}): " + "; ".join(parts) + "."


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "–"
    text = f"{_signed(entry['diff'])} ({entry['wins']}/{entry['losses']}) p={entry['p']:.2g}"
    if entry["reference"] in ("best baseline", "strongest competitor"):
        text += f" vs {entry['baseline']}"
    if entry.get("solved"):
        low, high = wilson_interval(entry["kept"], entry["solved"])
        share = entry["kept"] / entry["solved"]
        text += f", kept {entry['kept']}/{entry['solved']} = {100 * share:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"
    return f"**{text}**" if entry["significant"] else text


def _sentence(method: str, reference: str, entries: list[dict[str, Any]]) -> str:
    """'snapkv vs fullkv: below outside noise at C=64 (−50.0, p=0.031); within noise at C=128, 256.'"""
    above = [e for e in entries if e["significant"] and e["diff"] > 0]
    below = [e for e in entries if e["significant"] and e["diff"] < 0]
    noise = [e for e in entries if not e["significant"]]
    parts = []
    for label, chosen in (("above", above), ("below", below)):
        if chosen:
            detail = ", ".join(f"C={e['budget']} ({_signed(e['diff'])}, p={e['p']:.2g})" for e in chosen)
            parts.append(f"{label} it outside noise at {detail}")
    if noise:
        parts.append("within noise at C=" + ", ".join(e["budget"] for e in noise))
    return f"{method} vs {reference}: " + "; ".join(parts) + "."
