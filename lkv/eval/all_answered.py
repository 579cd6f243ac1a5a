"""Per-context rows of multi-question tasks (:mod:`lkv.eval.tasks.multi_question`): whether every question
of a context compressed once was answered (:func:`all_answered_rows`).

Derived from the per-question rows (``meta["context_id"]``, ``meta["questions"]``), they go into the report
as a task of their own, ``<task>/all``: its tables, Wilson intervals and paired comparisons (exact McNemar on
the contexts FullKV answered in full) are those of any 0/1 task.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

ALL_SUFFIX = "/all"


def all_answered_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, setting, method, budget, context) of the multi-question rows whose every question
    has a row: ``sample`` is the context id, ``score`` 1 when every question scored 1 (metric
    ``all_answered``), else 0. A context with a question still missing (a partial run) gives none."""
    groups: dict[tuple[str, str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        meta = row.get("meta") or {}
        if "context_id" in meta and "questions" in meta:
            key = (row["task"], row["setting"], row["method"], row["budget"], meta["context_id"])
            groups[key].append(row)
    out = []
    for (task, setting, method, budget, context_id), members in groups.items():
        questions = members[0]["meta"]["questions"]
        if len({r["sample"] for r in members}) != questions:
            continue
        score = float(all(r["score"] == 1.0 for r in members))
        out.append(
            {
                "task": task + ALL_SUFFIX,
                "sample": context_id,
                "method": method,
                "budget": budget,
                "setting": setting,
                "score": score,
                "metrics": {"all_answered": score},
                "meta": {"questions": questions},
            }
        )
    return out
