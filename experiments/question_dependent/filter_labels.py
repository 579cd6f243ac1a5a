"""Keep the distractor-prompt labels whose response holds the asked value (a label filter).

    python experiments/question_dependent/filter_labels.py [--source data/labels/distract/train]
        [--target data/labels/distract_ok/train]

The labels of experiments/question_dependent/configs/question_distractors_smollm2.yaml follow SmolLM2-135M's
own answers, which name another fact's value in a quarter of the distractor prompts: those labels teach the
module to keep the wrong fact. This copies the label folder without the ``find_value`` rows whose response
lacks the asked value (rebuilt from the label command's ``BuiltinPrompts`` settings); every other row is kept.
The folder's ``meta.json`` is copied (the rows are the same model's, prompts and settings).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import AutoTokenizer

from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.model.assets import model_dir

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT / "data/labels/distract/train")
    parser.add_argument("--target", type=Path, default=ROOT / "data/labels/distract_ok/train")
    args = parser.parse_args()
    if args.target.exists():
        raise SystemExit(f"{args.target} exists; remove it first")
    prompts = BuiltinPrompts(  # the label command of configs/question_distractors_smollm2.yaml here
        split="train",
        seed=5,
        num_prompts=64,
        min_words=600,
        max_words=800,
        retrieval_fraction=0.5,
        distractor_facts=3,
    )
    answers = {p.id: p.answer for p in prompts}
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    args.target.mkdir(parents=True)
    kept = dropped = 0
    for shard in sorted(args.source.glob("*.parquet")):
        table = pq.read_table(shard)
        rows = table.to_pylist()
        keep = [
            r["kind"] != "find_value" or answers[r["id"]] in tokenizer.decode(r["response_ids"]) for r in rows
        ]
        kept, dropped = kept + sum(keep), dropped + len(keep) - sum(keep)
        pq.write_table(table.filter(pa.array(keep)), args.target / shard.name)
    shutil.copy(args.source / "meta.json", args.target / "meta.json")
    print(f"kept {kept} labels, dropped {dropped} whose response lacks the asked value → {args.target}")


if __name__ == "__main__":
    main()
