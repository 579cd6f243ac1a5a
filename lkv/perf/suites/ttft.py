"""``ttft``: time to first token (prefill + scoring + eviction) per method, against a plain prefill.

Each method runs :meth:`lkv.eviction.compressor.Compressor.compress`; its overhead over a plain prefill is
the median of per-round differences (both ran back to back), and the eviction stage alone (scoring +
selection + gathering) is given as a share of the plain prefill — short, hence far less noisy than a
difference of two prefills. LookaheadKV and the per-token probe (``probe``) run randomly initialised modules
(timing does not depend on their weights). The probe, like SnapKV's window, does its work inside the prefill
(on each layer's attention input), so its cost shows in the overhead, not in the eviction stage.
"""

from __future__ import annotations

from typing import Any

from lkv.core.generation import prefill
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress
from lkv.perf.suites.base import Measured, Suite, fmt, timed
from lkv.perf.timing import Case
from lkv.perf.workbench import BenchSettings, Workbench


class TimeToFirstToken(Suite):
    name = "ttft"
    default_lengths = (1024, 2048, 4096, 8192)

    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        return ["prefill", *settings.methods]

    def reference(self, settings: BenchSettings) -> str:
        return "prefill"

    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        ids = bench.prompt(length)
        if variant == "prefill":

            def plain() -> None:
                prefill(bench.model, ids)

            return Case(run=plain)
        if bench.settings.budget >= length:
            raise ValueError(f"ttft: budget {bench.settings.budget} must be below the prompt length {length}")
        press = bench.press(variant)
        model = press.base_model if isinstance(press, LookaheadKVPress) else bench.model
        compressor = Compressor(model, bench.tokenizer, press, budget=bench.settings.budget)
        compressor.eos_token_ids = []  # LAQ/SpecKV pseudo responses always run their full length

        def run() -> dict[str, float]:
            out = compressor.compress(ids)
            return {"prefill_s": out.prefill_s, "eviction_s": out.eviction_s}

        return Case(run=run)

    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        derived: dict[str, Any] = {}
        if not timed(measured["prefill"]):
            return derived
        base = measured["prefill"]["median_s"]
        for method in settings.methods:
            if timed(measured[method]):
                overhead = measured[method]["minus_reference_s"]
                derived[method] = {
                    "overhead_s": overhead,
                    "overhead_pct": 100 * overhead / base,
                    # scoring + selection + gathering alone: short, so far less noisy than a difference
                    # of two prefills (but blind to work inside the prefill, e.g. SnapKV's capture)
                    "eviction_pct": 100 * measured[method]["median_eviction_s"] / base,
                }
        if "lookaheadkv" in derived:
            derived["lookaheadkv"]["floor_pct"] = 100 * settings.num_lookahead / length
            for method in settings.methods:
                if method in derived and method != "lookaheadkv":
                    # all their extra work happens in the eviction stage, so compare it there
                    derived[method]["x_lookaheadkv"] = (
                        derived[method]["eviction_pct"] / derived["lookaheadkv"]["eviction_pct"]
                    )
        return derived

    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        head = ["S", "method", "TTFT s", "eviction s", "eviction %", "overhead ms", "overhead %"]
        head.append("eviction × LookaheadKV")
        rows = []
        for length, measured in result["lengths"].items():
            d = result["derived"][length]
            rows.append(
                [length, "plain prefill", fmt(measured["prefill"].get("median_s")), "", "", "", "", ""]
            )
            for method in result["settings"]["methods"]:
                m = d.get(method, {})
                note = f" (floor M/S = {m['floor_pct']:.2f} %)" if "floor_pct" in m else ""
                rows.append(
                    [
                        length,
                        method + note,
                        fmt(measured[method].get("median_s")),
                        fmt(measured[method].get("median_eviction_s")),
                        fmt(m.get("eviction_pct"), digits=2),
                        fmt(m.get("overhead_s"), 1e-3, 1),
                        fmt(m.get("overhead_pct"), digits=2),
                        fmt(m.get("x_lookaheadkv"), digits=1),
                    ]
                )
        return head, rows
