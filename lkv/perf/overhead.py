"""The cost of a lookahead step against a plain prefill of the same prompt, for one or several modules.

The lookahead step is :meth:`LookaheadAdapter.predict` on the prompt's cache (``M`` tokens with the adapter
on, capture of their attention rows, crop back). Every module and the plain prefill run interleaved
(:func:`lkv.perf.timing.time_interleaved`, medians of ``repeats``), so modules sharing one frozen model (an
in-run ablation) are timed in one pass against one prefill timing.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from lkv.core.generation import prefill
from lkv.model.lookahead import LookaheadAdapter
from lkv.perf.timing import Case, time_interleaved

PREFILL = "prefill"


def lookahead_overhead(
    model: PreTrainedModel,
    adapters: dict[str, LookaheadAdapter],
    tokens: int,
    repeats: int,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Per module: ``prefill_ms`` and ``lookahead_ms`` of a ``tokens``-token random prompt, and ``overhead``,
    their ratio (lookahead step / prefill).

    Args:
        model: the model that prefills (any of the modules' ``model``: the adapters are off outside a step).
        adapters: name → lookahead module on ``model``.
        tokens: prompt length ``S``.
        repeats: timed rounds after one warm-up round.
    """
    if tokens <= 0:
        raise ValueError(f"overhead timing: expected a positive prompt length, got {tokens}")
    if PREFILL in adapters:
        raise ValueError(f"overhead timing: {PREFILL!r} names the plain prefill, not a module")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device)
    with torch.no_grad():
        cache, _ = prefill(model, ids)

        def plain_prefill() -> None:
            prefill(model, ids)

        def step(adapter: LookaheadAdapter) -> Case:
            def run() -> None:
                adapter.predict(cache, tokens)  # crops its own K/V off again

            return Case(run=run)

        cases = {PREFILL: Case(run=plain_prefill), **{name: step(a) for name, a in adapters.items()}}
        timings = time_interleaved(cases, repeats=repeats, warmup=1, device=device)
    prefill_s = timings.median(PREFILL)
    return {
        name: {
            "prefill_ms": 1e3 * prefill_s,
            "lookahead_ms": 1e3 * timings.median(name),
            "overhead": timings.median(name) / prefill_s,
        }
        for name in adapters
    }
