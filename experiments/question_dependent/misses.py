"""What each method answers when it misses a FullKV-solved question-dependent needle: a distractor's value (it
kept another of the eight facts), the asked value's first digits (part of the span), or something else.

    python experiments/question_dependent/misses.py [--budgets 128 256]

Reads experiments/question_dependent/results (the rows of
experiments/question_dependent/configs/trained_distractors.yaml), rebuilds the 72 samples from the config's
seeds to know every needle's value, and prints a markdown table.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from transformers import AutoTokenizer

from lkv.eval.results import FULL, RESULTS_FILE, ResultsFile
from lkv.eval.tasks import NeedleFamilyTask
from lkv.model.assets import model_dir

ROOT = Path(__file__).resolve().parents[2]
VALUE = re.compile(r"[0-9A-Za-z-]{4,}")  # a needle value: 4+ characters with a digit (numbers, codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", nargs="+", default=["128", "256"])
    args = parser.parse_args()
    rows = ResultsFile(ROOT / "experiments/question_dependent/results" / RESULTS_FILE).rows
    solved = {r["sample"] for r in rows if r["budget"] == FULL and r["score"] == 1.0}
    task = NeedleFamilyTask(  # experiments/question_dependent/configs/trained_distractors.yaml
        distribution="out",
        families=("trained_distractors",),
        haystacks=("essays", "pydoc"),
        lengths=(1024, 2048),
        depths=(0.1, 0.5, 0.9),
        samples_per_cell=6,
        seed=4,
    )
    samples = {s.id: s for s in task.samples(AutoTokenizer.from_pretrained(model_dir()))}
    kinds: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r["sample"] not in solved or r["budget"] not in args.budgets or r["score"] == 1.0:
            continue
        sample = samples[r["sample"]]
        values = {v for v in VALUE.findall(sample.context) if any(c.isdigit() for c in v)}
        if any(v in r["prediction"] for v in values - set(sample.answers)):
            kind = "a distractor's value"
        elif sample.answers[0][:3] in r["prediction"]:
            kind = "the value's first characters"
        else:
            kind = "something else"
        kinds[(r["method"], kind)] += 1
    columns = ["a distractor's value", "the value's first characters", "something else"]
    print(f"Misses of the {len(solved)} FullKV-solved samples at C = {', '.join(args.budgets)}:\n")
    print("| method | misses | " + " | ".join(columns) + " |")
    print("|---|---:|" + "---:|" * len(columns))
    for method in sorted({m for m, _ in kinds}):
        counts = [kinds[(method, c)] for c in columns]
        print(f"| {method} | {sum(counts)} | " + " | ".join(str(c) for c in counts) + " |")


if __name__ == "__main__":
    main()
