"""Decode-time methods on the embedded SmolLM2-135M (CPU, minutes): needle accuracy and cache length over time.

Needle: the held-out haystacks of ``scripts/niah_smoke.py`` (question-aware), decode-time methods beside
prefill-only ones at the same budgets. Cache length: one long generation per method (EOS ignored), the most
entries per KV head any layer holds after each token, plotted to a PNG.

    python scripts/decode_time_smoke.py niah                                    # ~4 min on 2 cores
    python scripts/decode_time_smoke.py cache --out docs/img/cache_length.png   # 512 tokens, ~4 min
"""

from __future__ import annotations

import argparse
import time

from niah_smoke import PRESS_ARGS, needle_prompt  # (run as a script: scripts/ is on sys.path)

from lkv.core.generation import Sampling
from lkv.eval.trace import cache_length_traces, plot_cache_lengths
from lkv.eviction.compressor import Compressor
from lkv.eviction.registry import make_method
from lkv.model.backbone import load_backbone

PREFILL_ONLY = ["fullkv", "streamingllm", "snapkv", "h2o", "tova"]
DECODE_TIME = ["h2o-decode", "scissorhands", "quest"]


def niah(args: argparse.Namespace) -> None:
    model, tokenizer = load_backbone(args.model)
    cases = [needle_prompt(tokenizer, args.tokens, depth, seed=i) for i, depth in enumerate(args.depths)]
    print(f"NIAH aware: ~{args.tokens}-token haystacks, needle depths {args.depths}, {args.model}")
    print(f"{'method':<14}" + "".join(f"{f'C={b}':>8}" for b in args.budgets) + "   seconds")
    for name in args.methods:
        compressor = Compressor(model, tokenizer, make_method(name, **PRESS_ARGS.get(name, {})))
        solved, start = dict.fromkeys(args.budgets, 0), time.perf_counter()
        for context, question, number in cases:
            scored = compressor.score(f"{context}\n\n{question}")  # one prefill + scoring for every budget
            for budget in args.budgets:
                out = compressor.decode(compressor.evict(scored, budget), Sampling(args.max_new_tokens))
                solved[budget] += number in out.text
        cells = "".join(f"{f'{solved[b]}/{len(cases)}':>8}" for b in args.budgets)
        print(f"{name:<14}{cells}   {time.perf_counter() - start:.0f}", flush=True)


def cache(args: argparse.Namespace) -> None:
    model, tokenizer = load_backbone(args.model)
    context, _, _ = needle_prompt(tokenizer, args.tokens, 0.5)
    request = f"{context}\n\nRetell the text above in detail, paragraph by paragraph."
    compressors = {name: Compressor(model, tokenizer, name, budget=args.budget) for name in args.methods}
    start = time.perf_counter()
    traces = cache_length_traces(compressors, request, args.max_new_tokens)
    for name, lengths in traces.items():
        print(f"{name:<14} kept {lengths[0]}, peak {max(lengths)}, last {lengths[-1]} entries per head")
    title = f"{args.model}: ~{args.tokens}-token prompt, budget {args.budget}"
    path = plot_cache_lengths(traces, args.budget, args.out, title)
    print(f"wrote {path} ({time.perf_counter() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    sub = parser.add_subparsers(dest="command", required=True)
    needle = sub.add_parser("niah", help="needle accuracy per method and budget")
    needle.add_argument("--tokens", type=int, default=1500, help="haystack length in tokens")
    needle.add_argument("--depths", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.8])
    needle.add_argument("--budgets", type=int, nargs="+", default=[64, 128])
    needle.add_argument("--methods", nargs="+", default=PREFILL_ONLY + DECODE_TIME)
    needle.add_argument("--max_new_tokens", type=int, default=32)
    length = sub.add_parser("cache", help="cache length over a long generation, as a PNG")
    length.add_argument("--tokens", type=int, default=1000, help="prompt length in tokens")
    length.add_argument("--budget", type=int, default=128)
    length.add_argument("--max_new_tokens", type=int, default=512)
    length.add_argument("--methods", nargs="+", default=["fullkv", "snapkv", *DECODE_TIME])
    length.add_argument("--out", default="docs/img/cache_length.png")
    args = parser.parse_args()
    if args.command == "niah":
        niah(args)
    else:
        cache(args)


if __name__ == "__main__":
    main()
