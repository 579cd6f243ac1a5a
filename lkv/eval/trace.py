"""Cache length over a long generation: how many K/V entries each method holds while it generates.

    traces = cache_length_traces({"snapkv": Compressor(model, tok, "snapkv", budget=128), ...}, prompt, 512)
    plot_cache_lengths(traces, budget=128, path="plots/cache_length.png", title="...")

Prefill-only methods hold the budget plus one entry per generated token; decode-time eviction policies stay
at the budget; Quest keeps the full cache (it only narrows each step's attention).
"""

from __future__ import annotations

import copy
from pathlib import Path

from matplotlib.figure import Figure

from lkv.core.generation import Sampling
from lkv.core.progress import Progress
from lkv.eviction.compressor import Compressor, Prompt


def cache_length_traces(
    compressors: dict[str, Compressor], prompt: Prompt, max_new_tokens: int, progress: bool = True
) -> dict[str, list[int]]:
    """Method name → ``max_new_tokens`` cache lengths: entries per KV head (the most any layer holds) before
    decoding, then after each generated token that is fed back (all but the last). EOS does not end the
    generation. ``progress``: a bar over the methods (a line per method when output is not a terminal)."""
    traces = {}
    for name, compressor in Progress("lkv trace", len(compressors), "methods", progress).track(
        compressors.items()
    ):
        endless = copy.copy(compressor)  # a shallow copy: same model and press, no EOS
        endless.eos_token_ids = []
        traces[name] = endless.generate(prompt, Sampling(max_new_tokens=max_new_tokens)).cache_lengths
    return traces


def plot_cache_lengths(traces: dict[str, list[int]], budget: int, path: str | Path, title: str) -> Path:
    """Cache length vs generated tokens, one line per method (Quest dashed: it attends to ≤ ``budget``
    entries but keeps them all), the budget as a dotted line; written as a PNG."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for name, lengths in traces.items():
        quest = name == "quest"
        ax.plot(
            range(len(lengths)),
            lengths,
            label=f"{name} (attends to ≤{budget})" if quest else name,
            linestyle="--" if quest else "-",
        )
    ax.axhline(budget, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("cached entries per KV head (max over layers)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
