"""Per-seed paired comparisons of the dev rows: the mix recipe against the long recipe of the same seed index, each
against the Oracle and the two mix seeds against each other (exact McNemar; counts, points, 95 % interval), per cell.

    python experiments/generalise/paired_seeds.py > experiments/generalise/results/dev_mix/paired_seeds.txt
"""

import sys
from pathlib import Path

sys.path.insert(0, "experiments/generalise")
import summary as S

from lkv.eval.paired import fullkv_solved
from lkv.eval.results import ResultsFile
from lkv.eval.stats import mcnemar_exact

rows = S.merged_rows(
    [
        ResultsFile(Path("experiments/generalise/results/dev/results.jsonl")).rows,
        S.renamed(ResultsFile(Path("experiments/generalise/results/dev_mix/results.jsonl")).rows, "mix"),
    ]
)
solved = fullkv_solved(rows, "generalise", "aware")
meta = {r["sample"]: r["meta"] for r in rows if r["sample"] in solved}
sc = {
    (r["method"], r["budget"], r["sample"]): float(r["score"] == 1.0) for r in rows if r["budget"] != "full"
}
pairs = [
    ("lookaheadkv@mix", "lookaheadkv", "mix0-old0"),
    ("lookaheadkv:mix_s1@mix", "lookaheadkv:long_s1", "mix1-old1"),
    ("oracle", "lookaheadkv@mix", "oracle-mix0"),
    ("oracle", "lookaheadkv:mix_s1@mix", "oracle-mix1"),
    ("lookaheadkv@mix", "lookaheadkv:mix_s1@mix", "mix0-mix1"),
]
cells = {
    "oos far": lambda m: m["source_group"] == "out-of-source" and m["bin"] == "far",
    "oos near": lambda m: m["source_group"] == "out-of-source" and m["bin"] == "near",
    "in far": lambda m: m["source_group"] == "in-source" and m["bin"] == "far",
    "in near": lambda m: m["source_group"] == "in-source" and m["bin"] == "near",
    "all far": lambda m: m["bin"] == "far",
    "all 79": lambda m: True,
    "heldout kinds": lambda m: m["kind_side"] == "heldout",
    "eval kinds": lambda m: m["kind_side"] == "eval",
    "train kinds": lambda m: m["kind_side"] == "train",
}
for name, f in cells.items():
    ss = sorted(s for s in solved if f(meta[s]))
    for b in ("128", "256"):
        out = [f"{name} (n={len(ss)}) C={b}:"]
        for m in (
            "lookaheadkv",
            "lookaheadkv:long_s1",
            "lookaheadkv@mix",
            "lookaheadkv:mix_s1@mix",
            "oracle",
        ):
            k = sum(sc[(m, b, s)] for s in ss)
            out.append(f"{m}={int(k)}")
        for a, o, lab in pairs:
            t = mcnemar_exact([sc[(a, b, s)] for s in ss], [sc[(o, b, s)] for s in ss])
            out.append(
                f"[{lab}: {100 * t.diff:+.0f} pts {t.wins}/{t.losses} p={t.p:.2g} CI {100 * t.low:+.0f},{100 * t.high:+.0f}]"
            )
        print(" ".join(out))
