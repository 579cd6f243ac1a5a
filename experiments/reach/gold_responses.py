"""Responses for `lkv label --responses` in which every find_value answer is right (gold where the labeller missed).

    python experiments/reach/gold_responses.py [--labels data/labels/reach_kinds/train]
        [--out data/labels/reach_gold_responses.jsonl]

The labels are the attention of the labeller's own answer. SmolLM2-135M answers only 10 of the 21 find_value
prompts among configs/experiments/reach_kinds_smollm2.yaml's 48 long prompts right: in the other 11 it names
another city or colour, or describes the text, so those labels teach the module to keep something else than
the asked fact. This writes one response per prompt of that label folder: the labeller's own response where
its answer holds the asked value and for every prompt without a checkable answer (where its tokens are not
the tokenizer's own tokenisation of its text, which `lkv label` refuses, that text's own tokens, cut to the
same length); otherwise the fact's own sentence as it stands in the passage (e.g. "The special magic number
for apple is 2283766."), followed by the end-of-turn token the labeller ends its answers with. `lkv label --responses` then teacher-forces these and
labels the attention that a right answer pays to the prompt (experiments/reach/README.md, section 12).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
from transformers import AutoTokenizer

from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.facts import FACT_FORMATS
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


def fact_sentence(content: str, value: str) -> str:
    """The fact statement in ``content`` whose value is ``value`` (a training format's sentence)."""
    for fact in FACT_FORMATS:
        head, tail = fact.statement.split("{value}")
        key = r"[\w'-]+(?: [\w'-]+)?"  # one or two words
        pattern = re.escape(head).replace(re.escape("{key}"), key) + re.escape(value + tail)
        match = re.search(pattern, content)
        if match:
            return match.group(0)
    raise ValueError(f"no fact statement with the value {value!r} in the prompt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, default=ROOT / "data/labels/reach_kinds/train")
    parser.add_argument("--out", type=Path, default=ROOT / "data/labels/reach_gold_responses.jsonl")
    args = parser.parse_args()
    prompts = BuiltinPrompts(  # the label command in configs/experiments/reach_kinds_smollm2.yaml's header
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
    by_id = {p.id: p for p in prompts}
    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    right = replaced = retokenised = 0
    lines = []
    for shard in sorted(args.labels.glob("*.parquet")):
        for row in pq.read_table(shard, columns=["id", "response_ids"]).to_pylist():
            prompt, ids = by_id[row["id"]], row["response_ids"]
            if prompt.answer is not None and prompt.answer not in tokenizer.decode(ids):
                sentence = fact_sentence(prompt.messages[-1]["content"], prompt.answer)
                ids = tokenizer(sentence, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
                replaced += 1
            else:
                right += prompt.answer is not None
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
