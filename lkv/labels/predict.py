"""The labeller as a Lightning predict loop (what `lkv label`, :mod:`lkv.commands.label`, runs), so any Lightning strategy scales it out.

Each rank labels a disjoint part of the prompts (Lightning's unrepeated distributed sampler for
prediction: every prompt exactly once, no padding duplicates) and writes its own shard sequence. Prompts
already present in finished shards are filtered out before the loop, so rerunning the same command after
an interruption finishes the set without duplicates or gaps.

With ``batch_size`` B > 1 a loader item is a batch of B prompts of similar length (sorted by their text
length, the longest first), labelled together by :func:`lkv.labels.batched.label_batch`; the padding
fraction of the stacked caches is printed at the end. With ``responses`` the responses come from a file
(:mod:`lkv.labels.responses`) and only the teacher-forced ground truth is computed. With ``gold_answers`` a
generated response that misses its prompt's expected answer is replaced by the reference response
(:mod:`lkv.labels.gold`), teacher-forced.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from lkv.core.chat import template_kwargs
from lkv.core.context import model_context
from lkv.core.generation import eos_ids
from lkv.core.progress import Progress, counted
from lkv.labels.batched import label_batch, label_response
from lkv.labels.gold import missed, reference_response
from lkv.labels.labeller import Label, label_questions, make_meta, split_prompt, split_questions
from lkv.labels.prompts import Prompt, render_prompt
from lkv.labels.responses import ResponsesFile
from lkv.labels.shards import REDUCTION_KEY, SETTING_KEY, ShardWriter
from lkv.model.backbone import DEFAULT_MODEL, load_backbone, model_signature

log = logging.getLogger(__name__)


class LabelingModule(L.LightningModule):
    """Wraps a frozen backbone; ``predict_step`` labels one batch of prompts (see ``label``'s batch_size).

    Args:
        responses: responses from another engine (only the teacher-forced pass runs), or None to generate.
        gold_answers: replace a generated response that misses its prompt's answer by the reference
            response (:func:`lkv.labels.gold.reference_response`), teacher-forced.
        question_reduction: ``agnostic`` labels of a context asked several questions: how their importances
            become one (:func:`lkv.labels.labeller.reduce_questions`).
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
        gold_answers: bool = False,
        question_reduction: str = "max",
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
        # prompts with a checkable answer; of those whose generated answer missed it, the ones corrected and
        # the ones whose answer is not in the prompt as rendered (cut by truncation) (--gold_answers)
        self.answers = 0
        self.corrected = 0
        self.unshown = 0

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
        context = model_context(self.backbone)
        if context is not None and hp.max_prompt_tokens + hp.response_tokens > context:
            # checked before any prefill: past its context a model answers garbage, after a long prefill
            raise ValueError(
                f"--max_prompt_tokens {hp.max_prompt_tokens} + --response_tokens {hp.response_tokens} is over "
                f"the model's context of {context} tokens; give --max_prompt_tokens "
                f"{context - hp.response_tokens} or less (longer prompts follow --truncation)"
            )

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
        questions: list[list[list[int]] | None] = []
        for prompt in batch:
            ids, question = self._render(prompt)
            if ids is not None:
                rendered.append((prompt, ids))
                questions.append(question)
        if not rendered:
            return [None] * len(batch)
        if hp.label_mode == "agnostic":
            # the question sits between context and response: labelled one prompt (and question) at a time
            labels = [
                label_questions(
                    self.backbone, ids, asked, hp.response_tokens, self.eos, hp.question_reduction
                )
                for (_, ids), asked in zip(rendered, questions, strict=True)
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
            if hp.gold_answers:
                labels = [self._gold(*item, label) for item, label in zip(rendered, labels, strict=True)]
            self.cache_tokens += len(prompts) * max(map(len, prompts))
            self.prompt_tokens += sum(map(len, prompts))
        results: list[dict[str, Any] | None] = [
            {"prompt": prompt, "prompt_ids": ids, "label": label}
            for (prompt, ids), label in zip(rendered, labels, strict=True)
        ]
        return results + [None] * (len(batch) - len(rendered))

    def _gold(self, prompt: Prompt, ids: list[int], label: Label) -> Label:
        """``label``, or where its response misses ``prompt``'s answer the label of the reference response."""
        self.answers += prompt.answer is not None
        if not missed(prompt, label.response_ids, self.tokenizer):
            return label
        shown = self.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        end = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.eos[0]
        reference = reference_response(prompt, shown, self.tokenizer, end, self.hparams.response_tokens)
        if reference is None:
            self.unshown += 1
            return label
        self.corrected += 1
        return Label(
            reference, label_response(self.backbone, ids, reference) if self.hparams.store_scores else None
        )

    def _render(self, prompt: Prompt) -> tuple[list[int] | None, list[list[int]] | None]:
        """``(prompt ids, questions' ids)``: the whole prompt and None (``aware``), or the context and the
        questions asked after it (``agnostic``: a multi-question prompt's ``meta["questions"]``
        (:func:`~lkv.labels.labeller.split_questions`), else the one trailing question
        (:func:`~lkv.labels.labeller.split_prompt`)); ``(None, None)`` for a prompt to skip."""
        hp = self.hparams
        if hp.label_mode != "agnostic":
            ids = render_prompt(
                prompt, self.tokenizer, hp.max_prompt_tokens, hp.truncation, hp.enable_thinking
            )
            if ids is None:
                log.warning(
                    "skipping prompt %s: longer than max_prompt_tokens=%d", prompt.id, hp.max_prompt_tokens
                )
            return ids, None
        users = [m for m in prompt.messages if m["role"] == "user"]
        cut = (hp.max_prompt_tokens, hp.truncation, hp.enable_thinking)
        if "questions" in prompt.meta:
            split = split_questions(self.tokenizer, prompt.meta["context"], prompt.meta["questions"], *cut)
        elif len(prompt.messages) == 1 and "question" in prompt.meta:
            split = split_prompt(self.tokenizer, users[0]["content"], prompt.meta["question"], *cut)
            split = None if split is None else (split[0], [split[1]])
        else:
            log.warning("skipping prompt %s: no single user turn ending in a known question", prompt.id)
            return None, None
        if split is None:
            log.warning(
                "skipping prompt %s: longer than max_prompt_tokens=%d", prompt.id, hp.max_prompt_tokens
            )
            return None, None
        return split


class ShardPredictionWriter(BasePredictionWriter):
    """Streams each rank's labels into its own atomic parquet shards, and shows the rank's progress as lines
    when output is not a terminal (:class:`~lkv.core.progress.Progress`; Lightning's bar draws the terminal)."""

    def __init__(self, output: str | Path, prompt_source: str, score_dtype: str, shard_size: int) -> None:
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.prompt_source = prompt_source
        self.score_dtype = score_dtype
        self.shard_size = shard_size
        self.writer: ShardWriter | None = None
        self.skipped = 0
        self.written = 0
        self.progress: Progress | None = None

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
                **run_meta(pl_module.responses, hp.gold_answers),
                "chat_template_kwargs": template_kwargs(hp.enable_thinking),
            },
        )
        meta.extra |= label_setting(hp.label_mode, hp.question_reduction)
        self.writer = ShardWriter(self.output, meta, self.shard_size, rank=trainer.global_rank)
        rank = f" (rank {trainer.global_rank})" if trainer.world_size > 1 else ""
        self.progress = Progress(
            f"lkv label{rank}",
            int(sum(trainer.num_predict_batches)),
            "batches",
            enabled=trainer.progress_bar_callback is not None,
            bar=False,
        )

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
        self.progress.update(note=f"{counted(self.written, 'prompt')} labelled")

    def on_predict_end(self, trainer: L.Trainer, pl_module: LabelingModule) -> None:
        self.writer.flush()


def label_setting(label_mode: str, question_reduction: str) -> dict[str, str]:
    """The label meta's ``extra`` entries naming the setting the labels train a module for (``setting``:
    ``aware`` or ``agnostic``) and, for agnostic labels, how a context's questions were reduced."""
    if label_mode == "agnostic":
        return {SETTING_KEY: label_mode, REDUCTION_KEY: question_reduction}
    return {SETTING_KEY: label_mode}


def run_meta(responses: ResponsesFile | None, gold_answers: bool) -> dict[str, Any]:
    """The label meta's ``extra`` entries naming where the responses came from (none when generated here)
    and whether wrong answers were replaced (only when they were, so older folders resume unchanged)."""
    extra: dict[str, Any] = {} if responses is None else {"responses": responses.source}
    if gold_answers:
        extra["gold_answers"] = True
    return extra
