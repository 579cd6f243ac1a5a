"""What a benchmark suite of ``lkv bench`` is: its variants, how one is built, and what is derived and shown.

A suite measures all its variants at each prompt length in one process, interleaved
(:func:`lkv.perf.timing.time_interleaved`); the runner (:mod:`lkv.perf.bench`) times them, adds peak memory
where :attr:`Suite.measures_memory`, and asks the suite for its derived figures and its table. Suites that
take ``--batch_sizes`` (label, decode) measure one variant per batch size instead of their pairwise ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from lkv.perf.timing import Case
from lkv.perf.workbench import BenchSettings, Workbench

MIB = 2**20
BATCH_PREFIX = "batch-"  # variants at a batch size: batch-1, batch-4, ...

#: Raw measurements of one length: variant → {"median_s", "peak_bytes", info keys, ...} or {"error"}.
Measured = dict[str, dict[str, Any]]


def fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    """``value / scale`` with ``digits`` decimals; ``—`` when missing."""
    return "—" if value is None else f"{value / scale:.{digits}f}"


def ratio(value: float | None) -> str:
    """``1.23×``; ``—`` when missing."""
    return "—" if value is None else f"{value:.2f}×"


def timed(*entries: dict[str, Any]) -> bool:
    """Whether every entry was measured (not failed, not skipped)."""
    return all("median_s" in entry for entry in entries)


def value(measured: Measured, variant: str, key: str) -> Any:
    """``measured[variant][key]``, None when the variant was not measured or lacks the key."""
    return measured.get(variant, {}).get(key)


def batch_size(variant: str) -> int:
    """``batch-8`` → 8."""
    return int(variant.removeprefix(BATCH_PREFIX))


class Suite(ABC):
    """One sub-benchmark (``lkv bench --which <name>``)."""

    name: ClassVar[str]
    default_lengths: ClassVar[tuple[int, ...]]
    #: whether the runner measures each variant's peak memory (a fresh subprocess per variant on the CPU)
    measures_memory: ClassVar[bool] = False
    #: whether every case runs one model only (the lookahead module's, or the plain one), so the workbench may
    #: inject the lookahead module into the model itself instead of a copy: half the weights' memory
    one_model: ClassVar[bool] = False

    @abstractmethod
    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        """The variants; with ``length``, those measured at that prompt length."""

    @abstractmethod
    def reference(self, settings: BenchSettings) -> str:
        """The variant the others are compared with (paired differences, speed-ups)."""

    @abstractmethod
    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        """One variant at one prompt length, ready to time."""

    @abstractmethod
    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        """The figures the suite is judged by at one length (missing measurements are skipped)."""

    def derive_across(self, settings: BenchSettings, lengths: dict[int, Measured]) -> dict[str, Any]:
        """Figures over all lengths (e.g. a line fit of peak memory in S); none by default."""
        return {}

    @abstractmethod
    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        """Header and rows of the Markdown table of a result (``{"settings", "lengths", "derived"}``)."""

    def memory_settings(self, settings: dict[str, Any], variant: str) -> dict[str, Any]:
        """The settings a memory subprocess rebuilds ``variant`` from (the same, unless a suite trims them)."""
        return settings


class BatchSizes:
    """The batch-size mode of a suite: one variant per ``--batch_sizes`` entry, each doing the same work.

    ``unit`` names what the work is counted in (``prompts``, ``tokens``): the case's ``info`` holds that
    count, and the rate is ``unit`` per second.
    """

    def __init__(self, unit: str) -> None:
        self.unit = unit

    @staticmethod
    def variants(settings: BenchSettings) -> list[str]:
        return [f"{BATCH_PREFIX}{size}" for size in settings.batch_sizes or []]

    @staticmethod
    def reference(settings: BenchSettings) -> str:
        return f"{BATCH_PREFIX}{min(settings.batch_sizes or [1])}"

    @staticmethod
    def rows(
        result: dict[str, Any], cells: Callable[[dict[str, Any], dict[str, Any]], list[Any]]
    ) -> list[list[Any]]:
        """One row per measured variant and length: ``[S, *cells(entry, derived figures)]``."""
        rows = []
        for length, measured in result["lengths"].items():
            for variant, entry in measured.items():
                if timed(entry):
                    rows.append([length, *cells(entry, result["derived"][length].get(variant, {}))])
        return rows

    def derive(self, settings: BenchSettings, measured: Measured) -> dict[str, Any]:
        """Per variant: ``<unit>_per_s`` and the speed-up over the smallest batch size."""
        base = measured[self.reference(settings)]
        derived: dict[str, Any] = {}
        for variant, entry in measured.items():
            if timed(entry):
                derived[variant] = {f"{self.unit}_per_s": entry[self.unit] / entry["median_s"]}
                if timed(base):
                    derived[variant]["speedup"] = base["median_s"] / entry["median_s"]
        return derived
