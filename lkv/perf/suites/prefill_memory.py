"""``prefill-memory``: peak memory and seconds of prefill + eviction, two-phase vs layer-streamed.

Both run :meth:`~lkv.eviction.compressor.Compressor.compress` with the ``stream_method`` (default
LookaheadKV, a randomly initialised module); ``streamed`` evicts each layer as the prefill produces it
(:mod:`lkv.eviction.streamed`). Beside the measurements: the K/V formula
:func:`lkv.eviction.streamed.peak_kv_bytes`.
"""

from __future__ import annotations

from typing import Any

from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress
from lkv.eviction.streamed import peak_kv_bytes
from lkv.perf.suites.base import MIB, Measured, Suite, fmt, ratio, timed
from lkv.perf.timing import Case
from lkv.perf.workbench import BenchSettings, Workbench


class PrefillMemory(Suite):
    name = "prefill-memory"
    default_lengths = (4096, 8192)
    measures_memory = True
    one_model = True  # LookaheadKV runs its module's base model; any other method the plain model

    def variants(self, settings: BenchSettings, length: int | None = None) -> list[str]:
        return ["two-phase", "streamed"]

    def reference(self, settings: BenchSettings) -> str:
        return "two-phase"

    def case(self, bench: Workbench, variant: str, length: int) -> Case:
        s = bench.settings
        if s.budget >= length:
            raise ValueError(f"prefill-memory: budget {s.budget} must be below the prompt length {length}")
        ids, press = bench.prompt(length), bench.press(s.stream_method)
        model = press.base_model if isinstance(press, LookaheadKVPress) else bench.model
        compressor = Compressor(model, None, press, s.budget, streamed=variant == "streamed")
        if not press.streamable:
            raise ValueError(f"prefill-memory: {press.name} has no layer-streamed eviction")

        def run() -> dict[str, float]:
            out = compressor.compress(ids)
            return {"prefill_s": out.prefill_s, "eviction_s": out.eviction_s}

        lookahead = s.num_lookahead if isinstance(press, LookaheadKVPress) else 0
        dtype_bytes = next(model.parameters()).element_size()
        formula = peak_kv_bytes(model.config, length, s.budget, lookahead, dtype_bytes)
        key = "streamed" if variant == "streamed" else "two_phase"
        return Case(run=run, info={"kv_formula_bytes": formula[key], "kv_full_bytes": formula["two_phase"]})

    def derive(self, settings: BenchSettings, length: int, measured: Measured) -> dict[str, Any]:
        two_phase, streamed = measured["two-phase"], measured["streamed"]
        if not timed(two_phase, streamed):
            return {}
        derived = {"time_ratio": streamed["median_s"] / two_phase["median_s"]}
        if "peak_bytes" in two_phase and "peak_bytes" in streamed:
            derived["memory_ratio"] = two_phase["peak_bytes"] / streamed["peak_bytes"]
            derived["saved_bytes"] = two_phase["peak_bytes"] - streamed["peak_bytes"]
            derived["formula_saved_bytes"] = two_phase["kv_formula_bytes"] - streamed["kv_formula_bytes"]
        return derived

    def table(self, result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        head = ["S", "two-phase s", "streamed s", "streamed/two-phase time", "two-phase peak MiB"]
        head += [
            "streamed peak MiB",
            "memory ratio",
            "saved MiB",
            "formula: saved MiB",
            "formula: streamed K/V MiB",
        ]
        rows = []
        for length, measured in result["lengths"].items():
            d = result["derived"][length]
            two_phase, streamed = measured["two-phase"], measured["streamed"]
            rows.append(
                [
                    length,
                    fmt(two_phase.get("median_s")),
                    fmt(streamed.get("median_s")),
                    fmt(d.get("time_ratio"), digits=2),
                    fmt(two_phase.get("peak_bytes"), MIB, 0),
                    fmt(streamed.get("peak_bytes"), MIB, 0),
                    ratio(d.get("memory_ratio")),
                    fmt(d.get("saved_bytes"), MIB, 0),
                    fmt(d.get("formula_saved_bytes"), MIB, 0),
                    fmt(streamed.get("kv_formula_bytes"), MIB, 1),
                ]
            )
        return head, rows
