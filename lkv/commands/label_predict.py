"""`lkv label`'s predict loop (:func:`predict`): torch and Lightning are imported here, once the options are
parsed, so `lkv label --help` stays light."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader

from lkv.commands.label_settings import LabelSettings
from lkv.core.progress import counted
from lkv.labels.batched import length_batches
from lkv.labels.predict import LabelingModule, ShardPredictionWriter
from lkv.labels.prompts import Prompt
from lkv.labels.responses import ResponsesFile
from lkv.train.progress import bar_on_terminal_only


def predict(
    run: LabelSettings, todo: list[Prompt], folder: Path, score_dtype: str, engine: ResponsesFile | None
) -> None:
    """Label the prompts ``todo`` into ``folder`` through a Lightning predict loop (``run``'s devices and
    strategy; each rank writes its own shards), then print what was skipped, corrected and padded."""
    module = LabelingModule(
        run.model,
        run.dtype,
        run.attn_implementation,
        run.response_tokens,
        run.max_prompt_tokens,
        run.truncation,
        run.store_scores,
        engine,
        run.label_mode,
        run.enable_thinking,
        run.gold_answers,
        run.question_reduction,
    )
    writer = ShardPredictionWriter(folder, run.prompts.describe(), score_dtype, run.shard_size)
    trainer = L.Trainer(
        accelerator=run.accelerator,
        devices=run.devices,
        num_nodes=run.num_nodes,
        strategy=run.strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=run.progress,
        callbacks=[writer],
        inference_mode=True,
    )
    bar_on_terminal_only(trainer)
    batch_size = run.batch_size
    batches = [[p] for p in todo] if batch_size == 1 else length_batches(todo, _prompt_chars, batch_size)
    loader = DataLoader(batches, batch_size=1, shuffle=False, collate_fn=_single)
    trainer.predict(module, loader, return_predictions=False)
    # Every rank's last shard is flushed before any rank counts the folder.
    trainer.strategy.barrier("lkv-label-flushed")
    _report_predict(run, module, writer.skipped, trainer.global_rank if trainer.world_size > 1 else None)


def _report_predict(run: LabelSettings, module: LabelingModule, skipped: int, rank: int | None) -> None:
    """Print the prompts ``skipped``, the answers ``--gold_answers`` corrected, and the padding of batched
    prompt caches (``rank``: this process's, in a multi-process run)."""
    if skipped:
        reason = "too long or without a known question" if run.label_mode == "agnostic" else "too long"
        print(
            f"lkv label: skipped {counted(skipped, 'prompt')} ({reason}; max_prompt_tokens={run.max_prompt_tokens})"
        )
    if run.gold_answers:
        print(
            f"lkv label: {module.corrected + module.unshown} of {module.answers} generated answers missed "
            f"the prompt's answer; the reference response was teacher-forced in place of {module.corrected} "
            "(--gold_answers)"
            + (
                f"; {module.unshown} keep theirs, their answer not in the prompt as rendered (truncation, "
                f"max_prompt_tokens={run.max_prompt_tokens})"
                if module.unshown
                else ""
            )
        )
    if run.batch_size > 1 and module.cache_tokens:
        where = f" (rank {rank})" if rank is not None else ""
        print(
            f"lkv label{where}: batches of {run.batch_size}, padding {1 - module.prompt_tokens / module.cache_tokens:.1%} "
            f"of the stacked prompt caches ({module.cache_tokens - module.prompt_tokens} of "
            f"{module.cache_tokens} token columns)"
        )


def _single(items: list[list[Prompt]]) -> list[Prompt]:
    """Collate of a loader whose every item is already a batch of prompts."""
    (batch,) = items
    return batch


def _prompt_chars(prompt: Prompt) -> int:
    """Length of a prompt's text: the sort key of length-bucketed batches (no tokenizer needed)."""
    return sum(len(m["content"]) for m in prompt.messages)
