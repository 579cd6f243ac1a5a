"""Needle-in-a-haystack smoke test of every eviction method on the embedded SmolLM2-135M (CPU, minutes).

A ~2K-token haystack of held-out Paul Graham essays hides "The special magic number for <city> is <n>." at
a few depths; the question closes the prompt (question-aware, as in the paper) or is appended after the
context was compressed (``--setting agnostic``). An answer counts when it contains the number.

    python scripts/niah_smoke.py                                   # all methods, budgets 64 128 256 512
    python scripts/niah_smoke.py --methods fullkv snapkv --budgets 128 --depths 0.5
    python scripts/niah_smoke.py --methods --adapter runs/smollm2_135m/checkpoints/last.ckpt   # LookaheadKV only
"""

from __future__ import annotations

import argparse
import random
import time

from lkv.core.generation import Sampling
from lkv.eviction.compressor import Compressor, encode_context
from lkv.eviction.presses.lookaheadkv import load_lookahead
from lkv.eviction.registry import make_method
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION, essay_documents, split_by_document
from lkv.model.backbone import load_backbone

CITIES = ("Chicago", "Lisbon", "Nairobi", "Osaka", "Toronto", "Valencia", "Hanoi", "Oslo")
QUESTION = (
    "What is the special magic number for {city} mentioned in the provided text? Answer with the number."
)
# Settings for CPU-sized runs: the Oracle scores a 32-token answer (its labels in the paper use 512).
PRESS_ARGS = {"oracle": {"response_tokens": 32}}


def needle_prompt(tokenizer, tokens: int, depth: float, seed: int = 0) -> tuple[str, str, str]:
    """``(context, question, number)``: ~``tokens`` tokens of held-out essays with the needle at ``depth``.

    The needle goes in at the first sentence end after ``depth`` of the haystack's characters.
    """
    rng = random.Random(seed)
    city, number = rng.choice(CITIES), str(rng.randint(1_000_000, 9_999_999))
    documents = essay_documents()
    _, heldout = split_by_document(list(documents), DEFAULT_HELDOUT_FRACTION)
    texts = [documents[doc].read_text() for doc in sorted(heldout)]
    ids = tokenizer(" ".join(" ".join(text.split()) for text in texts), add_special_tokens=False)["input_ids"]
    if len(ids) < tokens:
        raise ValueError(f"the held-out essays hold {len(ids)} tokens, fewer than the {tokens} asked for")
    haystack = tokenizer.decode(ids[:tokens])
    cut = haystack.find(". ", int(depth * len(haystack)))
    cut = len(haystack) if cut < 0 else cut + 2
    needle = f"The special magic number for {city} is {number}. "
    return haystack[:cut] + needle + haystack[cut:], QUESTION.format(city=city), number


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2000, help="haystack length in tokens")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument(
        "--methods",
        nargs="*",
        default=[
            "fullkv",
            "streamingllm",
            "snapkv",
            "pyramidkv",
            "h2o",
            "tova",
            "random",
            "laq",
            "speckv",
            "oracle",
        ],
    )
    parser.add_argument(
        "--adapter", help="exported LookaheadKV adapter folder or checkpoint (adds lookaheadkv)"
    )
    parser.add_argument("--setting", choices=["aware", "agnostic"], default="aware")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    args = parser.parse_args()

    if args.adapter:
        model, tokenizer, lookahead = load_lookahead(args.adapter, args.model)
    else:
        model, tokenizer = load_backbone(args.model)
    presses = {name: make_method(name, **PRESS_ARGS.get(name, {})) for name in args.methods}
    if args.adapter:
        presses["lookaheadkv"] = lookahead
    cases = [needle_prompt(tokenizer, args.tokens, depth, seed=i) for i, depth in enumerate(args.depths)]
    print(f"NIAH {args.setting}: ~{args.tokens}-token haystacks, needle depths {args.depths}, {args.model}")
    print(
        f"{'method':<13}" + "".join(f"{f'C={b}':>8}" for b in args.budgets) + "   answers at the first budget"
    )
    for name, press in presses.items():
        compressor = Compressor(model, tokenizer, press)
        solved, examples, start = dict.fromkeys(args.budgets, 0), [], time.perf_counter()
        for context, question, number in cases:
            # One prefill + scoring per prompt serves every budget.
            if args.setting == "aware":
                scored = compressor.score(f"{context}\n\n{question}")
            else:
                scored = compressor.score(encode_context(tokenizer, context))
            for budget in args.budgets:
                compressed = compressor.evict(scored, budget)
                if args.setting == "aware":
                    out = compressor.decode(compressed, Sampling(args.max_new_tokens))
                else:
                    out = compressor.answer(compressed, question, Sampling(args.max_new_tokens))
                solved[budget] += number in out.text
                if budget == args.budgets[0]:
                    examples.append(f"{number}→{out.text.strip()[-24:]!r}")
        cells = "".join(f"{f'{solved[b]}/{len(cases)}':>8}" for b in args.budgets)
        print(f"{name:<13}{cells}   {'; '.join(examples)}  ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
