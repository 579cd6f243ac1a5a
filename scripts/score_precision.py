"""How much ranking information each on-disk score encoding keeps at S = 1K, 16K, 128K prompt tokens.

Ground-truth rows ``s[l, h, :]`` are probabilities over the prompt: at S = 16K the typical score is ~1/S
≈ 6e-5, float16's smallest normal number, so plain float16 storage pushes most of a long row into
subnormals (fewer mantissa bits) or to zero, and equal stored values tie. This script encodes realistic
rows with each candidate, decodes them as the reader does, and compares with the float32 original:

- ``tied``: fraction of positions sharing their decoded value with another position of the row;
- ``zero``: fraction decoded to exactly 0; ``sum err``: max |row sum − 1| (the shard writer refuses > 1e-2);
- ``1 − τ``: one minus Kendall τ-b between decoded and original (0 = same ranking);
- ``recall loss @C``: one minus Recall@C of the decoded top-C against the original top-C.

Rows (``--rows`` per length) follow what ``lkv label`` measures on SmolLM2 (``--calibrate FOLDER`` prints
the same statistics for a real label folder; 3 held-out prompts of 367–681 tokens, R = 64: sink mass
0.35–0.45 on average, 0–0.97 per row; spread of the other log-scores 1.35–1.61 nats on average, 0.5–3.9
per row): log-normal scores over the prompt with a per-row spread σ drawn from [0.5, 3] nats and an
attention sink at position 0 holding 0–95 % of the mass.

    python scripts/score_precision.py --lengths 1024 16384 131072 --rows 32
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from lkv.core.metrics import kendall_tau_b, topk_recall
from lkv.labels.shards import load_labels, read_meta, row_scores

BUDGETS = (64, 512, 2048)
# candidate encodings: float16 and float32 are what `lkv label --score_dtype` writes (meta.json records it)
ENCODINGS = ("float16", "bfloat16", "float16 of S·score", "float32")


def round_trip(rows: torch.Tensor, encoding: str) -> torch.Tensor:
    """``rows (n, S)`` float32 → stored with ``encoding`` → read back as float32, as a reader would."""
    length = rows.shape[-1]
    if encoding == "float16 of S·score":
        return (rows * length).half().float() / length
    return rows.to(getattr(torch, encoding)).float()


def synthetic_rows(length: int, rows: int, seed: int) -> torch.Tensor:
    """``(rows, length)`` float32 rows summing to 1: log-normal scores plus a sink at position 0."""
    generator = torch.Generator().manual_seed(seed)
    sigma = 0.5 + 2.5 * torch.rand(rows, 1, generator=generator)
    logits = sigma * torch.randn(rows, length, generator=generator, dtype=torch.float64)
    scores = torch.softmax(logits, dim=-1)
    sink = 0.95 * torch.rand(rows, generator=generator, dtype=torch.float64)
    scores = scores * (1 - sink)[:, None]
    scores[:, 0] += sink
    return scores.float()


def tied_fraction(values: torch.Tensor) -> float:
    """Mean over rows of the fraction of positions whose value occurs more than once in their row."""
    fractions = []
    for row in values:
        _, inverse, counts = torch.unique(row, return_inverse=True, return_counts=True)
        fractions.append((counts[inverse] > 1).float().mean().item())
    return float(np.mean(fractions))


def measure(rows: torch.Tensor, encoding: str) -> dict[str, float]:
    """Statistics of ``rows (n, S)`` stored with ``encoding`` and read back, against the float32 rows."""
    length = rows.shape[-1]
    decoded = round_trip(rows, encoding)
    out = {
        "tied": tied_fraction(decoded),
        "zero": (decoded == 0).float().mean().item(),
        "nonfinite": (~torch.isfinite(decoded)).float().mean().item(),
        "sum err": (decoded.double().sum(-1) - 1).abs().max().item(),
        "1 - tau": 1 - kendall_tau_b(decoded, rows).mean().item(),
    }
    for budget in BUDGETS:
        if budget < length:
            out[f"recall loss @{budget}"] = 1 - topk_recall(decoded, rows, budget).mean().item()
    return out


def calibrate(folder: str) -> None:
    """Print each stored row's sink mass and the spread (std, nats) of its other log-scores."""
    meta = read_meta(folder)
    for row in load_labels(folder):
        scores = row_scores(row, meta, folder).flatten(0, 1).double()
        spread = scores[:, 1:].clamp_min(1e-30).log().std(-1)
        print(
            f"{row['id']}: S={scores.shape[-1]} sink mass {scores[:, 0].mean():.2f} "
            f"(range {scores[:, 0].min():.2f}–{scores[:, 0].max():.2f}), log-score std {spread.mean():.2f} nats "
            f"(range {spread.min():.2f}–{spread.max():.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 16384, 131072])
    parser.add_argument("--rows", type=int, default=32, help="(layer, KV head) rows per length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate", help="a label folder with float32 scores: print its row statistics")
    args = parser.parse_args()
    if args.calibrate:
        calibrate(args.calibrate)
        return
    columns = ["tied", "zero", "nonfinite", "sum err", "1 - tau", *(f"recall loss @{c}" for c in BUDGETS)]
    print("| S | encoding | " + " | ".join(columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    for length in args.lengths:
        rows = synthetic_rows(length, args.rows, args.seed)
        median = rows[:, 1:].median().item()
        print(f"| S = {length}: median score {median:.2e} (float16 smallest normal 6.1e-05) |")
        for encoding in ENCODINGS:
            stats = measure(rows, encoding)
            cells = [f"{stats[c]:.2e}" if c in stats and not math.isnan(stats[c]) else "–" for c in columns]
            print(f"| {length} | {encoding} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
