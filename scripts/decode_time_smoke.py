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

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from niah_smoke import PRESS_ARGS, needle_prompt  # noqa: E402  (run as a script: scripts/ is on sys.path)

from lkv.backbone import load_backbone  # noqa: E402
from lkv.decoding import make_method  # noqa: E402
from lkv.inference import Compressor  # noqa: E402

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
                out = compressor.decode(compressor.evict(scored, budget), args.max_new_tokens)
                solved[budget] += number in out.text
        cells = "".join(f"{f'{solved[b]}/{len(cases)}':>8}" for b in args.budgets)
        print(f"{name:<14}{cells}   {time.perf_counter() - start:.0f}", flush=True)


def cache(args: argparse.Namespace) -> None:
    model, tokenizer = load_backbone(args.model)
    context, _, _ = needle_prompt(tokenizer, args.tokens, 0.5)
    request = f"{context}\n\nRetell the text above in detail, paragraph by paragraph."
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in args.methods:
        compressor = Compressor(model, tokenizer, name, budget=args.budget)
        compressor.eos_token_ids = []  # generate all max_new_tokens, whatever the model would do
        start = time.perf_counter()
        out = compressor.generate(request, max_new_tokens=args.max_new_tokens)
        lengths = out.cache_lengths
        print(
            f"{name:<14} prompt {out.prompt_tokens}, kept {lengths[0]}, peak {max(lengths)}, last {lengths[-1]} "
            f"entries per head; decode {out.decode_s / len(out.token_ids) * 1000:.0f} ms/token "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        style = {"linestyle": "--"} if name == "quest" else {}
        label = f"{name} (attends to ≤{args.budget})" if name == "quest" else name
        ax.plot(range(len(lengths)), lengths, label=label, **style)
    ax.axhline(args.budget, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("cached entries per KV head (max over layers)")
    ax.set_title(f"{args.model}: ~{args.tokens}-token prompt, budget {args.budget}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


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
