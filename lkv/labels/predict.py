"""`lkv label`: the labeller as a Lightning predict loop, so any Lightning strategy scales it out.

Each rank labels a disjoint part of the prompts (Lightning's unrepeated distributed sampler for
prediction: every prompt exactly once, no padding duplicates) and writes its own shard sequence. Prompts
already present in finished shards are filtered out before the loop, so rerunning the same command after
an interruption finishes the set without duplicates or gaps.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader

from lkv.core.generation import eos_ids
from lkv.labels.labeller import label_prompt, make_meta
from lkv.labels.prompts import Prompt, PromptSource, render_prompt
from lkv.labels.shards import META_FILE, ShardWriter, finished_ids, read_meta, shard_files
from lkv.model.backbone import DEFAULT_MODEL, ModelSignature, check_compatible, load_backbone, model_signature

log = logging.getLogger(__name__)


class LabelingModule(L.LightningModule):
    """Wraps a frozen backbone; ``predict_step`` labels one prompt (batch size 1)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        response_tokens: int = 64,
        max_prompt_tokens: int = 2048,
        truncation: str = "middle",
        store_scores: bool = True,
        enable_thinking: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = None
        self.tokenizer = None

    def configure_model(self) -> None:
        if self.backbone is not None:
            return
        hp = self.hparams
        # `self.device` is still the CPU here (Lightning moves the module after this hook): load straight
        # onto the rank's device instead, so no rank stages the weights in host memory
        device = self._trainer.strategy.root_device if self._trainer is not None else self.device
        self.backbone, self.tokenizer = load_backbone(
            hp.model, dtype=hp.dtype, attn_implementation=hp.attn_implementation, device=device
        )
        self.eos = eos_ids(self.backbone, self.tokenizer)

    def predict_step(self, batch: list[Prompt], batch_idx: int) -> dict[str, Any] | None:
        (prompt,) = batch
        hp = self.hparams
        ids = render_prompt(
            prompt, self.tokenizer, hp.max_prompt_tokens, hp.truncation, template_kwargs(hp.enable_thinking)
        )
        if ids is None:
            log.warning(
                "skipping prompt %s: longer than max_prompt_tokens=%d", prompt.id, hp.max_prompt_tokens
            )
            return None
        label = label_prompt(self.backbone, ids, hp.response_tokens, self.eos, hp.store_scores)
        return {"prompt": prompt, "prompt_ids": ids, "label": label}


class ShardPredictionWriter(BasePredictionWriter):
    """Streams each rank's labels into its own atomic parquet shards."""

    def __init__(self, output: str | Path, prompt_source: str, score_dtype: str, shard_size: int) -> None:
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.prompt_source = prompt_source
        self.score_dtype = score_dtype
        self.shard_size = shard_size
        self.writer: ShardWriter | None = None
        self.skipped = 0
        self.written = 0

    def on_predict_start(self, trainer: L.Trainer, pl_module: LabelingModule) -> None:
        hp = pl_module.hparams
        meta = make_meta(
            model_signature(pl_module.backbone, pl_module.tokenizer, hp.model).to_dict(),
            response_tokens=hp.response_tokens,
            max_prompt_tokens=hp.max_prompt_tokens,
            truncation=hp.truncation,
            score_dtype=self.score_dtype,
            store_scores=hp.store_scores,
            prompt_source=self.prompt_source,
            extra={"chat_template_kwargs": template_kwargs(hp.enable_thinking)},
        )
        self.writer = ShardWriter(self.output, meta, self.shard_size, rank=trainer.global_rank)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        if prediction is None:
            self.skipped += 1
            return
        prompt: Prompt = prediction["prompt"]
        label = prediction["label"]
        self.writer.add(
            id=prompt.id,
            prompt_ids=prediction["prompt_ids"],
            response_ids=label.response_ids,
            scores=label.scores,
            source=prompt.source,
            kind=prompt.kind,
            doc_id=prompt.doc_id,
        )
        self.written += 1

    def on_predict_end(self, trainer: L.Trainer, pl_module: LabelingModule) -> None:
        self.writer.flush()


def template_kwargs(enable_thinking: bool) -> dict[str, Any]:
    """Chat-template variables of a label run (recorded in ``meta.json`` as ``extra.chat_template_kwargs``)."""
    return {"enable_thinking": enable_thinking}


def _check_resumable(output: Path, **settings: Any) -> None:
    """Fail before loading any model when ``output`` holds a run with other settings."""
    if not (output / META_FILE).exists():
        return
    meta = read_meta(output)
    for key, value in settings.items():
        found = meta.extra.get(key) if key == "chat_template_kwargs" else getattr(meta, key)
        if found != value:
            raise ValueError(
                f"{output} already holds labels with {key}={found!r}, this run asks for {value!r}; "
                "use another --output or delete it"
            )


def _check_labelled_by(folder: Path, model: str, dtype: str, attn_implementation: str) -> None:
    """Fail unless ``folder``'s labels were made by ``model`` (loaded only when named differently)."""
    expected = read_meta(folder).model
    if expected.get("name") == model:
        return
    backbone, tokenizer = load_backbone(model, dtype=dtype, attn_implementation=attn_implementation)
    check_compatible(
        ModelSignature.from_dict(expected),
        model_signature(backbone, tokenizer, model),
        f"label folder {folder}",
    )


def label(
    output: str,
    prompts: PromptSource,
    model: str = DEFAULT_MODEL,
    response_tokens: int = 64,
    max_prompt_tokens: int = 2048,
    truncation: Literal["middle", "left", "skip", "error"] = "middle",
    store_scores: bool = True,
    score_dtype: Literal["float16", "float32"] | None = None,
    shard_size: int = 32,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    enable_thinking: bool = False,
    accelerator: str = "auto",
    devices: int | str = 1,
    num_nodes: int = 1,
    strategy: str = "auto",
    progress: bool = True,
) -> str:
    """Generate each prompt's greedy response and its ground-truth importance, as parquet label shards.

    Args:
        output: label folder (created; a rerun resumes it and skips finished prompts).
        prompts: prompt source, e.g. ``{class_path: BuiltinPrompts, init_args: {split: train, num_prompts: 96}}``.
        model: embedded short name (``smollm2-135m``), local folder, ``.gguf`` file or hub id.
        response_tokens: R, the longest response generated per prompt (paper: 512).
        max_prompt_tokens: prompts longer than this follow ``truncation``.
        truncation: ``middle`` (LongBench-style: keep both ends), ``left`` (keep the end), ``skip``, ``error``.
        store_scores: False stores responses only; training then computes the ground truth online.
        score_dtype: on-disk dtype of the scores; None: ``float32`` for a new folder, the folder's own when
            resuming one. ``float16`` halves the size but loses the ranking of long prompts' small scores
            (below its smallest normal 6.1e-5 ≈ 1/16384; table in docs/scale_out.md): use it only for
            prompts of a few thousand tokens.
        shard_size: samples per shard; an interrupted run redoes at most this many per rank.
        dtype: model weights dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: ``sdpa`` (default) or ``eager`` (``flex_attention`` is refused).
        enable_thinking: passed to the chat template. Off by default: Qwen3's template then renders an empty
            ``<think></think>`` block, so the R response tokens are the answer rather than reasoning text
            (templates without the variable ignore it). Recorded in ``meta.json``
            (``extra.chat_template_kwargs``); a rerun must use the same value.
        accelerator, devices, num_nodes, strategy: Lightning Trainer settings (e.g. 8 GPUs: devices=8, strategy=ddp).
        progress: show a progress bar.
    """
    for name, value in (
        ("response_tokens", response_tokens),
        ("max_prompt_tokens", max_prompt_tokens),
        ("shard_size", shard_size),
    ):
        if value <= 0:
            raise ValueError(f"--{name}: expected a positive number, found {value}")
    folder = Path(output)
    if score_dtype is None:
        score_dtype = read_meta(folder).score_dtype if (folder / META_FILE).exists() else "float32"
    _check_resumable(
        folder,
        response_tokens=response_tokens,
        max_prompt_tokens=max_prompt_tokens,
        truncation=truncation,
        score_dtype=score_dtype,
        store_scores=store_scores,
        chat_template_kwargs=template_kwargs(enable_thinking),
    )
    all_prompts = list(prompts)
    if not all_prompts:
        raise ValueError(
            f"prompts: expected at least one prompt, the source yielded none ({prompts.describe()})"
        )
    ids = [p.id for p in all_prompts]
    if len(set(ids)) != len(ids):
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"prompts: expected unique prompt ids, found duplicates {duplicates[:5]}")
    done = finished_ids(folder) if folder.exists() else set()
    todo = [p for p in all_prompts if p.id not in done]
    if done and not todo:
        # Nothing left to label, so no shard writer will compare the model with the folder's: do it here.
        _check_labelled_by(folder, model, dtype, attn_implementation)
    print(
        f"lkv label: {len(all_prompts)} prompts, {len(done)} already labelled, {len(todo)} to go → {folder}"
    )
    if todo:
        module = LabelingModule(
            model,
            dtype,
            attn_implementation,
            response_tokens,
            max_prompt_tokens,
            truncation,
            store_scores,
            enable_thinking,
        )
        writer = ShardPredictionWriter(folder, prompts.describe(), score_dtype, shard_size)
        trainer = L.Trainer(
            accelerator=accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=progress,
            callbacks=[writer],
            inference_mode=True,
        )
        loader = DataLoader(todo, batch_size=1, shuffle=False, collate_fn=list)
        trainer.predict(module, loader, return_predictions=False)
        # Every rank's last shard is flushed before any rank counts the folder.
        trainer.strategy.barrier("lkv-label-flushed")
        if writer.skipped:
            print(f"lkv label: skipped {writer.skipped} prompts longer than {max_prompt_tokens} tokens")
    return f"{len(finished_ids(folder))} labelled prompts in {len(shard_files(folder))} shards at {folder}"
