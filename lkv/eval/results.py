"""The result files of an ``lkv eval`` folder: ``results.jsonl`` (appended row by row, so a rerun resumes)
and ``run.json`` (what made the rows, so a rerun with another model or settings is refused)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from lkv.core.budget import Budget
from lkv.eviction.roles import ADAPTER_METHOD, roles_of

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
#: ``run.json`` keys that a run which does not use them leaves None (no adapter without lookaheadkv rows, no
#: probe without probe rows)
UNUSED_WHEN_NONE = frozenset({"adapter", "probe"})
#: ``run.json`` keys added after folders were made without them: a missing key reads as this value
ADDED_KEYS = {"head_budget": "equal", "truncate": "error"}
#: ``run.json`` key of the named lookahead modules (``lkv eval --adapters``: name → fingerprint), which a later
#: run may extend
NAMED = "adapters"


FULL = "full"  # budget column of FullKV's rows (no eviction)
NO_BUDGET = "-"  # budget column of importance rows (one row carries every Recall@C)


def budget_key(budget: Budget | None) -> str:
    """The budget column of a result row: ``"128"``, ``"0.25"``, or :data:`FULL` for a method that evicts
    nothing (``None``). Importance rows, which carry every Recall@C, write :data:`NO_BUDGET`."""
    return FULL if budget is None else str(budget)


def parse_budget_key(key: str) -> Budget | str:
    """The budget of a row's budget column (:func:`budget_key`'s inverse); :data:`FULL` and :data:`NO_BUDGET`
    come back as they are."""
    if key in (FULL, NO_BUDGET):
        return key
    return Budget(int(key) if key.isdigit() else float(key))


def budget_order(key: str) -> tuple[int, float]:
    """Sort key of budget columns: budgets (ratios, which are ≤ 1, before tokens), then FullKV, then "-"."""
    budget = parse_budget_key(key)
    if isinstance(budget, Budget):
        return (0, float(budget.value))
    return (1, 0.0) if budget == FULL else (2, 0.0)


def adapter_method(method: str) -> bool:
    """Whether ``method``'s rows come from a trained lookahead module (``lookaheadkv``, ``lookaheadkv:<name>``):
    they depend on the adapter; every other method's rows are the same whatever the adapter."""
    return roles_of(method).requires == "adapter"


@dataclass(frozen=True, kw_only=True)
class ResultRow:
    """One line of ``results.jsonl``: a (task, sample, method, budget, setting) and what it scored.

    Every benchmark kind writes the fields without a default; an end task (generation under eviction) adds its
    answer (``prediction`` … ``finish``, ``kept_tokens``, ``kv_fraction``, ``decode_s``), a needle-token task
    its per-head shares (``per_head``, ``value_tokens``, ``fullkv_score``); an importance row adds nothing. The
    fields are declared in the order the file writes its keys, and :meth:`as_json` leaves out the optional
    ones that are None, so a row reads back key for key as the folders written before this class were.
    """

    task: str
    sample: str
    method: str
    budget: str  # :func:`budget_key`
    setting: str
    score: float
    metrics: dict[str, Any]
    prediction: str | None = None
    answers: list[str] | None = None
    answer_ids: list[int] | None = None
    finish: str | None = None
    per_head: list[float] | None = None
    prompt_tokens: int
    value_tokens: int | None = None
    fullkv_score: float | None = None
    kept_tokens: float | None = None
    kv_fraction: float | None = None
    prefill_s: float
    score_s: float
    decode_s: float | None = None
    meta: dict[str, Any]
    threshold: float | None = None  # under threshold selection: the calibrated threshold of its budget
    kept_std: float | None = (
        None  # under threshold selection: the spread of kept entries over (layer, KV head)
    )

    def as_json(self) -> dict[str, Any]:
        """The row as ``results.jsonl`` holds it: the fields in declaration order, unset optional ones left out."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.default is MISSING or getattr(self, f.name) is not None
        }


def row_key(row: dict[str, Any]) -> tuple[str, str, str, str, str]:
    return (row["task"], row["sample"], row["method"], row["budget"], row["setting"])


class ResultsFile:
    """Append-only JSONL of result rows; rows already present are reported done (resume)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if path.exists():
            with path.open(encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    try:
                        self.rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        # Only a run killed mid-write leaves a broken line, and only as the last one.
                        print(f"lkv eval: ignoring unreadable line {number} of {path} (interrupted write)")
        self.done = {row_key(row): row for row in self.rows}

    def add(self, row: ResultRow | dict[str, Any]) -> None:
        """Append ``row`` (a :class:`ResultRow`, or a row read from another folder) and flush it."""
        if isinstance(row, ResultRow):
            row = row.as_json()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one unbuffered write to a file opened for appending: rows of processes sharing the folder never interleave
        with self.path.open("ab", buffering=0) as out:
            out.write((json.dumps(row) + "\n").encode("utf-8"))
        self.rows.append(row)
        self.done[row_key(row)] = row


def check_same_samples(
    metas: dict[str, dict[str, Any]], rows: Iterable[dict[str, Any]], task: str, where: str
) -> None:
    """Refuse samples of ``task`` (``metas``: sample id -> its ``meta`` as the task builds it now) that now build
    other prompts than the ``rows`` with their ids were scored on.

    A sample id names a prompt only as long as its generator and its text are unchanged: a text source that
    reads this machine's files (Debian changelogs, headers) gives another haystack when those files change,
    under the same id. Resuming, or screening, on such a sample would mix outcomes of two prompts.

    Raises:
        ValueError: naming ``where``, how many samples changed, and for the first three their ids and keys.
    """
    # as JSON reads it back, like a row's; keys only one side holds are not compared (older rows stay valid)
    built = {sample: json.loads(json.dumps(meta)) for sample, meta in metas.items()}
    changed: dict[str, set[str]] = {}  # sample id -> the meta keys some row of it holds otherwise
    for row in rows:
        meta, recorded = built.get(row.get("sample")) if row.get("task") == task else None, row.get("meta")
        if meta is not None and isinstance(recorded, dict):
            keys = {key for key in meta.keys() & recorded.keys() if meta[key] != recorded[key]}
            if keys:
                changed.setdefault(row["sample"], set()).update(keys)
    if changed:
        shown = "; ".join(
            f"{sample} (meta differs in: {', '.join(sorted(keys))})"
            for sample, keys in list(changed.items())[:3]
        )
        raise ValueError(
            f"{where}: {len(changed)} sample(s) of task {task!r} now build other prompts than their rows there "
            f"were scored on, e.g. {shown}. A text source's files (or the task's generator) changed on this "
            "machine: give the task's sources the documents the rows used (its `roots`), or use a new folder"
        )


def fingerprint(path: str | Path) -> str:
    """sha256 (first 16 hex digits) of a file, or of a folder's files in name order."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def unrecorded_keys(output: Path, keys: Iterable[str]) -> set[str]:
    """Those of ``keys`` that ``output``'s ``run.json`` lacks (it was written before lkv recorded them); none
    when the folder holds no run yet."""
    path = output / RUN_FILE
    return set() if not path.exists() else set(keys) - set(json.loads(path.read_text()))


#: ``run.json`` key of the per-method settings
PRESS_ARGS = "press_args"
#: what a lookahead module's settings were before ``run.json`` recorded them (the default kernel then)
UNRECORDED_LOOKAHEAD_ARGS = {"kernel": 1}


def _press_args_agree(previous: dict[str, Any], info: dict[str, Any], held: set[str]) -> bool:
    """Whether two runs' ``press_args`` agree on every method whose rows the folder holds.

    Any other method's settings count only where the folder holds its rows (``held``: the methods of its
    ``results.jsonl``), and must match there (absent = absent): a method a later run adds (the probe and
    RestoreKV after a FullKV-only stage) brings its own. A lookahead module's count only where the earlier run
    had that module (its ``adapter``, its named ``adapters``): its rows are then in the folder, and an entry it
    did not record reads as :data:`UNRECORDED_LOOKAHEAD_ARGS`.
    """
    before, now = previous.get(PRESS_ARGS) or {}, info.get(PRESS_ARGS) or {}
    modules = {ADAPTER_METHOD} if previous.get("adapter") is not None else set()
    modules |= {f"{ADAPTER_METHOD}:{name}" for name in previous.get(NAMED, {})}
    for method in set(before) | set(now):
        if adapter_method(method):
            if (
                method in modules
                and method in now
                and before.get(method, UNRECORDED_LOOKAHEAD_ARGS) != now[method]
            ):
                return False
        elif method in held and before.get(method) != now.get(method):
            return False
    return True


def held_methods(output: Path) -> set[str]:
    """The methods with rows in ``output``'s results file (none when it has none)."""
    return {row["method"] for row in ResultsFile(output / RESULTS_FILE).rows}


def check_run(output: Path, info: dict[str, Any], unrecorded: Iterable[str] = ()) -> None:
    """Write ``run.json``, or refuse to resume a folder whose earlier run used another model or settings.

    A key of :data:`UNUSED_WHEN_NONE` that is None in one of the two runs was not used by it (no ``lookaheadkv``
    rows without an adapter), so it is not compared: baselines evaluated first are kept when a later run adds
    the adapter's rows to the folder, and ``run.json`` then records the adapter. Two different adapters are
    still refused. A key of ``unrecorded`` that ``run.json`` lacks (:func:`unrecorded_keys`) is recorded
    without comparison: the caller has checked that the folder's rows agree with its value.
    """
    path = output / RUN_FILE
    if path.exists():
        previous = json.loads(path.read_text())
        # named modules (`lkv eval --adapters`) may be added later; a name must keep its module
        named = {**previous.get(NAMED, {}), **info.get(NAMED, {})}
        before = previous.get(NAMED, {})
        changed = sorted(n for n, f in info.get(NAMED, {}).items() if before.get(n, f) != f)
        if changed:
            raise ValueError(
                f"{output} holds results of other lookahead modules under the names {changed} "
                f"({ {n: previous[NAMED][n] for n in changed} } vs { {n: info[NAMED][n] for n in changed} }); "
                "use other names, another --output, or delete the folder"
            )
        if named:
            info = {**info, NAMED: named}
        known = {**ADDED_KEYS, **previous}
        differing = sorted(
            k
            for k in info
            if k != NAMED
            and not (k == PRESS_ARGS and _press_args_agree(previous, info, held_methods(output)))
            and known.get(k) != info[k]
            and not (k in UNUSED_WHEN_NONE and (known.get(k) is None or info[k] is None))
            and not (k in unrecorded and k not in previous)
        )
        if differing:
            raise ValueError(
                f"{output} holds results of another run (differs in: {', '.join(differing)}: "
                f"{ {k: known.get(k) for k in differing} } vs { {k: info[k] for k in differing} }); "
                "use another --output or delete the folder"
            )
        merged = {**info, **{k: v for k, v in previous.items() if v is not None}}
        if PRESS_ARGS in info:  # the lookahead modules added by this run keep their settings
            merged[PRESS_ARGS] = {**(previous.get(PRESS_ARGS) or {}), **info[PRESS_ARGS]}
        if named:
            merged[NAMED] = named
        if merged != previous:
            path.write_text(json.dumps(merged, indent=2, sort_keys=True))
        return
    output.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2, sort_keys=True))


def copy_adapter_free(source: Path, target: Path, keep_probe: bool = True) -> int:
    """Start the new eval folder ``target`` with the rows of ``source`` that no adapter made (FullKV, the
    training-free methods, Oracle) and ``source``'s ``run.json`` without its adapter, so an ``lkv eval`` of the
    same config with another adapter resumes there and evaluates only the adapter's rows. ``keep_probe=False``
    also leaves out the probe's rows and its record, for a run that names another probe (which the recorded
    one would refuse). Returns the number of rows copied.

    Raises:
        FileExistsError: ``target`` exists (its rows would be mixed with ``source``'s).
    """

    def model_free(method: str) -> bool:
        return not adapter_method(method) and (keep_probe or roles_of(method).requires != "probe")

    rows = [r for r in ResultsFile(source / RESULTS_FILE).rows if model_free(r["method"])]
    info = {k: v for k, v in json.loads((source / RUN_FILE).read_text()).items() if k != NAMED} | {
        "adapter": None
    }
    if not keep_probe:
        info["probe"] = None
    # the lookahead modules' settings go with their rows, and so do the probes' folders when their rows do
    info[PRESS_ARGS] = {m: a for m, a in (info.get(PRESS_ARGS) or {}).items() if model_free(m)}
    target.mkdir(parents=True)
    (target / RUN_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
    with (target / RESULTS_FILE).open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)
