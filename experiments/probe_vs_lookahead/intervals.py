"""Bootstrap 95 % intervals of the probe's held-out importance metrics per seed, and the paired test against
SnapKV on the same prompts, from the `lkv eval` rows in results/
(experiments/probe_vs_lookahead/configs/probe_importance.yaml).

    python experiments/probe_vs_lookahead/intervals.py
"""

import json
from pathlib import Path

from lkv.eval.stats import bootstrap_interval, paired_test

RESULTS = Path(__file__).parent / "results"
METRICS = ["recall@32", "recall@64", "recall@128", "recall@256", "kendall_tau"]

for seed in (0, 1):
    rows = [json.loads(line) for line in (RESULTS / f"importance_seed{seed}.jsonl").read_text().splitlines()]
    by = {m: {r["sample"]: r["metrics"] for r in rows if r["method"] == m} for m in ("probe", "snapkv")}
    samples = sorted(by["probe"])
    for metric in METRICS:
        probe = [by["probe"][s][metric] for s in samples]
        snap = [by["snapkv"][s][metric] for s in samples]
        low, high = bootstrap_interval(probe)
        test = paired_test(probe, snap)
        print(
            f"seed {seed} {metric}: {sum(probe) / len(probe):.3f} [{low:.3f}, {high:.3f}] (n={len(probe)}); "
            f"vs snapkv {test.diff:+.3f} ({test.wins}/{test.losses}, p={test.p:.3g})"
        )
