"""`lkv label`: the labeller as a Lightning predict loop, so any Lightning strategy scales it out.

Each rank labels a disjoint part of the prompts (Lightning's unrepeated distributed sampler for
prediction: every prompt exactly once, no padding duplicates) and writes its own shard sequence. Prompts
already present in finished shards are filtered out before the loop, so rerunning the same command after
an interruption finishes the set without duplicates or gaps.

With ``batch_size`` B > 1 a loader item is a batch of B prompts of similar length (sorted by their text
length, the longest first), labelled together by :func:`lkv.labels.batched.label_batch`; the padding
fraction of the stacked caches is printed at the end. With ``responses`` the responses come from a file
(:mod:`lkv.labels.responses`) and only the teacher-forced ground truth is computed.
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
from lkv.labels.batched import label_batch, label_response, length_batches
from lkv.labels.labeller import LABEL_MODES, Label, label_prompt, make_meta, split_prompt
from lkv.labels.prompts import Prompt, PromptSource, render_prompt
from lkv.labels.responses import ResponsesFile
from lkv.labels.shards import META_FILE, ShardWriter, finished_ids, read_meta, shard_files
from lkv.model.backbone import DEFAULT_MODEL, ModelSignature, check_compatible, load_backbone, model_signature

log = logging.getLogger(__name__)


class LabelingModule(L.LightningModule):
    """Wraps a frozen backbone; ``predict_step`` labels one batch of prompts (see ``label``'s batch_size).

    Args:
        responses: responses from another engine (only the teacher-forced pass runs), or None to generate.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        response_tokens: int = 64,
        max_prompt_tokens: int = 2048,
        truncation: str = "middle",
        store_scores: bool = True,
        responses: ResponsesFile | None = None,
        label_mode: str = "aware",
        enable_thinking: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["responses"])
        self.backbone = None
        self.tokenizer = None
        self.responses = responses
        self.response_ids: dict[str, list[int]] = {}
        # tokens of the stacked prompt caches: all columns, and those holding prompt tokens (not padding)
        self.cache_tokens = 0
        self.prompt_tokens = 0

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

    def tokenize_responses(self) -> None:
        """Token ids of every given response, checked (:meth:`ResponsesFile.tokens`) before anything is
        written, not hours into the run."""
        if self.responses is not None and not self.response_ids:
            self.response_ids = {
                key: self.responses.tokens(key, self.tokenizer, self.hparams.response_tokens)
                for key in self.responses.responses
            }

    def predict_step(self, batch: list[Prompt], batch_idx: int) -> list[dict[str, Any] | None]:
        """Labels of a batch of prompts: a dict per prompt, None for a prompt skipped (too long, or in
        ``agnostic`` mode without a known trailing question)."""
        hp = self.hparams
        rendered: list[tuple[Prompt, list[int]]] = []
        questions: list[list[int] | None] = []
        for prompt in batch:
            ids, question = self._render(prompt)
            if ids is not None:
                rendered.append((prompt, ids))
                questions.append(question)
        if not rendered:
            return [None] * len(batch)
        if hp.label_mode == "agnostic":
            # the question sits between context and response: labelled one prompt at a time
            labels = [
                label_prompt(self.backbone, ids, hp.response_tokens, self.eos, hp.store_scores, question)
                for (_, ids), question in zip(rendered, questions, strict=True)
            ]
        elif self.responses is not None:
            self.tokenize_responses()
            labels = []
            for prompt, ids in rendered:
                self.responses.check_prompt(prompt.id, ids)
                response = self.response_ids[prompt.id]
                scores = label_response(self.backbone, ids, response) if hp.store_scores else None
                labels.append(Label(response, scores))
        else:
            prompts = [ids for _, ids in rendered]
            labels = label_batch(self.backbone, prompts, hp.response_tokens, self.eos, hp.store_scores)
            self.cache_tokens += len(prompts) * max(map(len, prompts))
            self.prompt_tokens += sum(map(len, prompts))
        results: list[dict[str, Any] | None] = [
            {"prompt": prompt, "prompt_ids": ids, "label": label}
            for (prompt, ids), label in zip(rendered, labels, strict=True)
        ]
        return results + [None] * (len(batch) - len(rendered))

    def _render(self, prompt: Prompt) -> tuple[list[int] | None, list[int] | None]:
        """``(prompt ids, question ids)``: the whole prompt and None (``aware``), or the context and its
        trailing question (``agnostic``); ``(None, None)`` for a prompt to skip."""
        hp = self.hparams
        if hp.label_mode != "agnostic":
            ids = render_prompt(
                prompt,
                self.tokenizer,
                hp.max_prompt_tokens,
                hp.truncation,
                template_kwargs(hp.enable_thinking),
            )
            if ids is None:
                log.warning(
                    "skipping prompt %s: longer than max_prompt_tokens=%d", prompt.id, hp.max_prompt_tokens
                )
            return ids, None
        users = [m for m in prompt.messages if m["role"] == "user"]
        if len(prompt.messages) != 1 or "question" not in prompt.meta:
            log.warning("skipping prompt %s: no single user turn ending in a known question", prompt.id)
            return None, None
        split = split_prompt(
            self.tokenizer, users[0]["content"], prompt.meta["question"], hp.max_prompt_tokens, hp.truncation
        )
        if split is None:
            log.warning(
                "skipping prompt %s: longer than max_prompt_tokens=%d", prompt.id, hp.max_prompt_tokens
            )
            return None, None
        return split


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
        pl_module.tokenize_responses()  # the meta names the responses only once they passed their checks
        meta = make_meta(
            model_signature(pl_module.backbone, pl_module.tokenizer, hp.model).to_dict(),
            response_tokens=hp.response_tokens,
            max_prompt_tokens=hp.max_prompt_tokens,
            truncation=hp.truncation,
            score_dtype=self.score_dtype,
            store_scores=hp.store_scores,
            prompt_source=self.prompt_source,
            extra={
                **responses_meta(pl_module.responses),
                "chat_template_kwargs": template_kwargs(hp.enable_thinking),
            },
        )
        meta.extra["label_mode"] = hp.label_mode
        self.writer = ShardWriter(self.output, meta, self.shard_size, rank=trainer.global_rank)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ):
        for item in prediction:
            if item is None:
                self.skipped += 1
                continue
            prompt: Prompt = item["prompt"]
            label = item["label"]
            self.writer.add(
                id=prompt.id,
                prompt_ids=item["prompt_ids"],
                response_ids=label.response_ids,
                scores=label.scores,
                source=prompt.source,
                kind=prompt.kind,
                doc_id=prompt.doc_id,
            )
            self.written += 1

    def on_predict_end(self, trainer: L.Trainer, pl_module: LabelingModule) -> None:
        self.writer.flush()


def responses_meta(responses: ResponsesFile | None) -> dict[str, Any]:
    """The label meta's ``extra`` entry naming where the responses came from (none when generated here)."""
    return {} if responses is None else {"responses": responses.source}


def _single(items: list[list[Prompt]]) -> list[Prompt]:
    """Collate of a loader whose every item is already a batch of prompts."""
    (batch,) = items
    return batch


def _prompt_chars(prompt: Prompt) -> int:
    """Length of a prompt's text: the sort key of length-bucketed batches (no tokenizer needed)."""
    return sum(len(m["content"]) for m in prompt.messages)


def template_kwargs(enable_thinking: bool) -> dict[str, Any]:
    """Chat-template variables of a label run (recorded in ``meta.json`` as ``extra.chat_template_kwargs``)."""
    return {"enable_thinking": enable_thinking}


def _check_resumable(output: Path, **settings: Any) -> None:
    """Fail before loading any model when ``output`` holds a run with other settings."""
    if not (output / META_FILE).exists():
        return
    meta = read_meta(output)
    for key, value in settings.items():
        if key == "label_mode":  # folders from before label modes existed are question-aware
            found = meta.extra.get(key, "aware")
        elif key == "chat_template_kwargs":
            found = meta.extra.get(key)
        elif key == "extra":
            found = {k: v for k, v in meta.extra.items() if k not in ("label_mode", "chat_template_kwargs")}
        else:
            found = getattr(meta, key)
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
    batch_size: int = 1,
    responses: str | None = None,
    enable_thinking: bool = False,
    accelerator: str = "auto",
    devices: int | str = 1,
    num_nodes: int = 1,
    strategy: str = "auto",
    progress: bool = True,
    label_mode: Literal["aware", "agnostic"] = "aware",
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
        batch_size: prompts decoded together; batches hold prompts of similar length (sorted by text length,
            the longest first) and the share of padding is printed. The labels equal batch 1's (see
            docs/performance.md for the speed-up); 1 keeps the prompts in their source order.
        responses: a JSONL file of responses generated elsewhere (``{"id", "response"|"response_ids"}`` per
            line, e.g. by vLLM or TGI; see :mod:`lkv.labels.responses`): no generation, only the teacher-forced
            ground truth. Every prompt needs a response; the meta records the file and its SHA-256.
        enable_thinking: passed to the chat template. Off by default: Qwen3's template then renders an empty
            ``<think></think>`` block, so the R response tokens are the answer rather than reasoning text
            (templates without the variable ignore it). Recorded in ``meta.json``
            (``extra.chat_template_kwargs``); a rerun must use the same value.
        accelerator, devices, num_nodes, strategy: Lightning Trainer settings (e.g. 8 GPUs: devices=8, strategy=ddp).
        progress: show a progress bar.
        label_mode: ``aware`` (the paper): the module sees the whole prompt and the target is the response's
            attention. ``agnostic``: the module sees only the context (the prompt without its trailing
            question) and the target is the attention that the question *and* the response pay to the context
            — a module for question-agnostic compression. Needs prompts that name their question
            (``BuiltinPrompts`` records it in ``meta["question"]``; others are skipped) and stored scores;
            prompts are labelled one at a time and responses are generated here.
    """
    if label_mode not in LABEL_MODES:
        raise ValueError(f"--label_mode: expected one of {LABEL_MODES}, found {label_mode!r}")
    if label_mode == "agnostic" and not store_scores:
        raise ValueError(
            "--label_mode agnostic needs --store_scores true: online targets are computed from the stored "
            "prompt and response alone, and the question would be missing"
        )
    if label_mode == "agnostic" and responses is not None:
        raise ValueError(
            "--label_mode agnostic generates its responses here; --responses is for aware labels"
        )
    for name, value in (
        ("response_tokens", response_tokens),
        ("max_prompt_tokens", max_prompt_tokens),
        ("shard_size", shard_size),
        ("batch_size", batch_size),
    ):
        if value <= 0:
            raise ValueError(f"--{name}: expected a positive number, found {value}")
    folder = Path(output)
    if score_dtype is None:
        score_dtype = read_meta(folder).score_dtype if (folder / META_FILE).exists() else "float32"
    engine = None if responses is None else ResponsesFile(responses)
    _check_resumable(
        folder,
        response_tokens=response_tokens,
        max_prompt_tokens=max_prompt_tokens,
        truncation=truncation,
        score_dtype=score_dtype,
        store_scores=store_scores,
        label_mode=label_mode,
        extra=responses_meta(engine),
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
    if engine is not None:
        engine.check_covers(p.id for p in todo)
        engine.keep_only(p.id for p in todo)
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
            engine,
            label_mode,
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
        batches = [[p] for p in todo] if batch_size == 1 else length_batches(todo, _prompt_chars, batch_size)
        loader = DataLoader(batches, batch_size=1, shuffle=False, collate_fn=_single)
        trainer.predict(module, loader, return_predictions=False)
        # Every rank's last shard is flushed before any rank counts the folder.
        trainer.strategy.barrier("lkv-label-flushed")
        if writer.skipped:
            reason = "too long or without a known question" if label_mode == "agnostic" else "too long"
            print(
                f"lkv label: skipped {writer.skipped} prompts ({reason}; max_prompt_tokens={max_prompt_tokens})"
            )
        if batch_size > 1 and module.cache_tokens:
            rank = f" (rank {trainer.global_rank})" if trainer.world_size > 1 else ""
            print(
                f"lkv label{rank}: batches of {batch_size}, padding {1 - module.prompt_tokens / module.cache_tokens:.1%} "
                f"of the stacked prompt caches ({module.cache_tokens - module.prompt_tokens} of "
                f"{module.cache_tokens} token columns)"
            )
    return f"{len(finished_ids(folder))} labelled prompts in {len(shard_files(folder))} shards at {folder}"
