"""lkv's RestoreKV against NVIDIA kvpress's ``RestoreKVPress`` on the embedded SmolLM2-135M (docs/kvpress.md).

A restore folder, lkv's trained one (``--folder``: an ``lkv export`` of a ``RestoreKVModule`` checkpoint) or
one made with seeded random weights (normal embeddings, a rank-8 LoRA with random B), is loaded into both
without the hub; per held-out essay prompt (chat template) and budget ``C`` (64, 128, S/2):
the overlap of the context entries kept per layer and KV head (kvpress's layer-wise selection vs lkv's
``adaptive, safeguard 0``; the top-``C − n`` of kvpress's scores vs lkv's equal budgets) and the largest
difference of the restore tokens' keys and values (:mod:`lkv.integrations.kvpress_restorekv`). Run in the
kvpress environment (``make kvpress-env``)::

    PYTHONPATH=$PWD .venv-kvpress/bin/python scripts/kvpress_restorekv.py --prompts 2 [--folder RESTORE_FOLDER]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers.utils import logging as hf_logging

from lkv.integrations.kvpress_reference import heldout_prompts, kvzip_sink
from lkv.integrations.kvpress_restorekv import restorekv_parity
from lkv.model.backbone import load_backbone
from lkv.model.restore import NUM_RESTORE_TOKENS, RestoreAdapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="held-out prompts")
    parser.add_argument("--min-words", type=int, default=400)
    parser.add_argument("--max-words", type=int, default=700)
    parser.add_argument("--folder", help="a trained restore folder (default: seeded random weights)")
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_backbone("smollm2-135m")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or scratch
        if args.folder is None:
            random_restore_folder(folder)
        rows: dict[str, list] = {}
        lengths = []
        for prompt_id, ids in heldout_prompts(tokenizer, args.prompts, args.min_words, args.max_words):
            lengths.append(ids.shape[1])
            for name, budget in {"64": 64, "128": 128, "S/2": ids.shape[1] // 2}.items():
                parity = restorekv_parity(model, tokenizer, ids, folder, budget, kvzip_sink(tokenizer, ids))
                rows.setdefault(name, []).append(parity)
            print(f"prompt {prompt_id}: {ids.shape[1]} tokens", flush=True)

    weights = args.folder or "seeded random weights"
    print(
        f"\n{len(lengths)} held-out prompts of {min(lengths)}–{max(lengths)} tokens, SmolLM2-135M, sdpa, {weights}\n"
    )
    print(
        "| C | layer-wise min / mean overlap | per-head min / mean overlap | max key diff | max value diff |"
    )
    print("|---|---|---|---|---|")
    for name, parities in rows.items():
        layerwise = [v for p in parities for v in p.layerwise]
        per_head = [v for p in parities for v in p.per_head]
        print(
            f"| {name} | {min(layerwise):.3f} / {sum(layerwise) / len(layerwise):.4f} | "
            f"{min(per_head):.3f} / {sum(per_head) / len(per_head):.4f} | "
            f"{max(p.key_error for p in parities):.2e} | {max(p.value_error for p in parities):.2e} |"
        )


def random_restore_folder(folder: str) -> None:
    """A restore module for SmolLM2-135M with seeded random weights, saved to ``folder``."""
    base, _ = load_backbone("smollm2-135m")
    adapter = RestoreAdapter.create(base, num_tokens=NUM_RESTORE_TOKENS, init="normal", seed=0)
    generator = torch.Generator().manual_seed(0)
    for name, param in adapter.trainable_parameters().items():
        if "lora_B" in name:
            param.data.copy_(0.01 * torch.randn(param.shape, generator=generator))
    adapter.save(folder)


if __name__ == "__main__":
    main()
