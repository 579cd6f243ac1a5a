"""Responses for `lkv label --responses` in which every find_value answer is right (gold where the labeller missed).

    python experiments/reach/gold_responses.py [--labels data/labels/reach_kinds/train]
        [--out data/labels/reach_gold_responses.jsonl]

The labels are the attention of the labeller's own answer. SmolLM2-135M answers only 10 of the 21 find_value
prompts among experiments/reach/configs/reach_kinds_smollm2.yaml's 48 long prompts right: in the other 11 it
names another city or colour, or describes the text, so those labels teach the module to keep something else
than the asked fact. This writes one response per prompt of that label folder: the labeller's own response
where its answer holds the asked value and for every prompt without a checkable answer (where its tokens are
not the tokenizer's own tokenisation of its text, which `lkv label --responses` refuses, that text's own
tokens, cut to the same length); otherwise the fact's own sentence as it stands in the passage (e.g. "The
special magic number for apple is 2283766.") and the end-of-turn token
(:func:`lkv.labels.gold.reference_response`). `lkv label --responses` then teacher-forces these and labels the
attention that a right answer pays to the prompt (experiments/reach/sections/12_right_answers.md). `lkv label
--gold_answers` does the same in one run, but keeps the labeller's own tokens where this file must retokenise
(3 of the 48 prompts).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq
from transformers import AutoTokenizer

from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.gold import missed, reference_response
from lkv.model.assets import model_dir

ROOT = Path(__file__).resolve().parents[2]
# the fact formats of the long prompts (every training format)
FORMATS = [
    "magic_number",
    "passcode",
    "vault_code",
    "room_number",
    "colour",
    "venue",
    "ingredient",
    "departure",
]
RESPONSE_TOKENS = 64  # the label command's --response_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, default=ROOT / "data/labels/reach_kinds/train")
    parser.add_argument("--out", type=Path, default=ROOT / "data/labels/reach_gold_responses.jsonl")
    args = parser.parse_args()
    prompts = (
        BuiltinPrompts(  # the label command in experiments/reach/configs/reach_kinds_smollm2.yaml's header
            split="train",
            seed=3,
            num_prompts=48,
            min_words=1000,
            max_words=3000,
            code_fraction=0.15,
            retrieval_fraction=0.5,
            fact_depths=[0.0, 0.6],
            fact_formats=FORMATS,
        )
    )
    by_id = {p.id: p for p in prompts}
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    right = replaced = retokenised = 0
    lines = []
    for shard in sorted(args.labels.glob("*.parquet")):
        for row in pq.read_table(shard, columns=["id", "prompt_ids", "response_ids"]).to_pylist():
            prompt, ids = by_id[row["id"]], row["response_ids"]
            wrong = missed(prompt, ids, tokenizer)
            right += prompt.answer is not None and not wrong
            reference = None
            if wrong:  # the prompt as `lkv label` rendered it, decoded only where an answer needs a reference
                shown = tokenizer.decode(row["prompt_ids"], clean_up_tokenization_spaces=False)
                reference = reference_response(
                    prompt, shown, tokenizer, tokenizer.eos_token_id, RESPONSE_TOKENS
                )
            if reference is not None:
                ids = reference
                replaced += 1
            canonical = tokenizer(tokenizer.decode(ids), add_special_tokens=False).input_ids
            if canonical != ids:  # generated in a tokenisation `lkv label` refuses: the same text's own
                ids = canonical[: len(ids)]  # tokens, cut to the response's length (--response_tokens)
                retokenised += 1
            lines.append(json.dumps({"id": row["id"], "response_ids": ids}))
    args.out.write_text("".join(line + "\n" for line in lines))
    print(
        f"{len(lines)} responses: {right} right answers kept, {replaced} replaced by the fact, "
        f"{retokenised} retokenised (not in the tokenizer's own tokenisation) → {args.out}"
    )


if __name__ == "__main__":
    main()
