"""Reference check of lkv's baselines against NVIDIA kvpress's implementations (docs/kvpress.md).

The embedded SmolLM2-135M with eager attention, held-out essay prompts in the chat template; per method and
budget ``C`` (64, 128, S/2) the overlap ``|lkv ∩ kvpress| / C_l`` over all layers, KV heads and prompts (min
and mean), from :mod:`lkv.integrations.kvpress_reference`. Run in the kvpress environment
(``make kvpress-env``)::

    PYTHONPATH=$PWD .venv-kvpress/bin/python scripts/kvpress_reference.py --prompts 6
    PYTHONPATH=$PWD .venv-kvpress/bin/python scripts/kvpress_reference.py --only expected keydiff adakv kvzip
"""

from __future__ import annotations

import argparse

from transformers.utils import logging as hf_logging

from lkv.integrations.kvpress_reference import (
    default_checks,
    describe,
    heldout_prompts,
    kvzip_sink,
    reference_overlaps,
)
from lkv.model.backbone import load_backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    parser.add_argument("--min-words", type=int, default=900)
    parser.add_argument("--max-words", type=int, default=1400)
    parser.add_argument(
        "--only", nargs="*", default=None, help="check labels starting with these (default: all)"
    )
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_backbone("smollm2-135m", attn_implementation="eager")
    checks = None
    results: dict[tuple[str, str], list[float]] = {}
    lengths = []
    for prompt_id, ids in heldout_prompts(tokenizer, args.prompts, args.min_words, args.max_words):
        checks = checks or [c for c in default_checks(kvzip_sink(tokenizer, ids)) if pick(c.label, args.only)]
        lengths.append(ids.shape[1])
        budgets = {"64": 64, "128": 128, "S/2": ids.shape[1] // 2}
        for key, values in reference_overlaps(model, ids, checks, budgets, tokenizer).items():
            results.setdefault(key, []).extend(values)
        print(f"prompt {prompt_id}: {ids.shape[1]} tokens", flush=True)

    print(f"\n{len(lengths)} held-out prompts of {min(lengths)}–{max(lengths)} tokens, SmolLM2-135M, eager\n")
    print("| method | lkv settings | kvpress press | C | min overlap | mean overlap |")
    print("|---|---|---|---|---|---|")
    for check in checks:
        settings = ", ".join(f"{k}={v}" for k, v in check.settings.items())
        if check.selector.recent:
            settings += f"{', ' if settings else ''}selector recent={check.selector.recent}"
        if check.selector.head_budget != "equal":
            settings += (
                f"{', ' if settings else ''}head_budget={check.selector.head_budget}, "
                f"safeguard={check.selector.safeguard}"
            )
        for name in ("64", "128", "S/2"):
            values = results[(check.label, name)]
            print(
                f"| {check.label} | {settings or 'defaults'} | `{describe(check.kvpress)}` | {name} | "
                f"{min(values):.3f} | {sum(values) / len(values):.4f} |"
            )


def pick(label: str, prefixes: list[str] | None) -> bool:
    """Whether ``label`` is among the checks asked for (``--only``; none given: all of them)."""
    return prefixes is None or any(label.startswith(prefix) for prefix in prefixes)


if __name__ == "__main__":
    main()
