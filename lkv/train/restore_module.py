"""RestoreKV's training (arXiv 2608.01247): self-distillation of the restore tokens from the full-cache teacher.

Per label row (``prompt_ids`` + ``response_ids``, the response teacher-forced):

1. prefill the prompt with the adapter off under ``no_grad``;
2. KVzip scores the prompt and the shared selector keeps ``C − n`` entries per KV head
   (:class:`~lkv.eviction.presses.restorekv.RestoreKVPress`, equal head budgets); eviction is by index, nothing
   about it is differentiated;
3. the ``n`` restore tokens run over the full cache with the LoRA on and grad
   (:meth:`~lkv.model.restore.RestoreAdapter.restore`); their K/V are appended to the evicted cache;
4. teacher: the frozen model reads the response after the full cache (positions ``S, S+1, ...``); student: the
   same frozen model reads it after the evicted cache + restore K/V (positions ``S+n, ...``, as at inference);
5. loss = KL(teacher ‖ student) of the next-token distributions, averaged over the response's tokens after the
   first (the first is predicted from the prompt's own last position, computed before any eviction: the same
   for both). Gradients reach the restore embeddings and the LoRA only, through the restore K/V.

A prompt the budget holds whole is not evicted (teacher = student); a step whose batch holds only such prompts
is skipped. Validation logs ``val/kl`` and, as the reference line, ``val/kvzip_kl``: the same KL for KVzip alone
at the full budget ``C`` (no restore tokens). ``lkv export`` writes the restore folder
:meth:`RestoreKVPress.from_folder` and ``lkv eval --methods [restorekv]`` load.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from transformers import DynamicCache

from lkv.core.cache import append_entries, gather_cache
from lkv.core.compat import cache_kwargs
from lkv.core.generation import prefill
from lkv.eviction.presses import KVzipPress, PressContext
from lkv.eviction.presses.restorekv import RestoreKVPress
from lkv.eviction.selector import select_indices
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.restore import NUM_RESTORE_TOKENS, RESTORE_ADAPTER, RestoreAdapter
from lkv.train.datamodule import Sample
from lkv.train.frozen import FrozenLLMModule
from lkv.train.optim import OptimSettings

RESTORE_OPTIM = OptimSettings()


class RestoreKVModule(FrozenLLMModule):
    """Trains ``n`` restore embeddings and a LoRA by self-distillation (module docstring).

    It shares :class:`~lkv.train.frozen.FrozenLLMModule`'s frozen-model loading, optimiser, gradient clipping
    and trimmed checkpoints; its steps and metrics are its own (no importance is predicted): ``train/loss``
    (the distillation KL), ``train/prompt_tokens``, and ``val/kl``, ``val/kvzip_kl`` (``test/...`` likewise).

    Args:
        model, dtype, attn_implementation: the frozen LLM (as :class:`~lkv.train.module.LookaheadKVModule`).
        num_restore: ``n``, the restore tokens (the paper's 8).
        restore_init: ``vocab_mean``, ``random_tokens`` or ``normal`` (:func:`lkv.model.tokens.init_embeddings`).
        lora_rank, lora_alpha, lora_dropout, lora_targets: the LoRA active only for the restore tokens.
        budget: ``C``, tokens per KV head of the student's cache, the ``n`` restore slots included.
        chunk_size, overlap: KVzip's reconstruction chunks.
        optim: AdamW and its schedule (:class:`~lkv.train.optim.OptimSettings`).
        seed: seed of the embedding and LoRA initialisation.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        num_restore: int = NUM_RESTORE_TOKENS,
        restore_init: Literal["vocab_mean", "random_tokens", "normal"] = "vocab_mean",
        lora_rank: int = 8,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        lora_targets: list[str] | str = "all-linear",
        budget: int = 128,
        chunk_size: int = 2048,
        overlap: int = 8,
        optim: OptimSettings = RESTORE_OPTIM,
        seed: int = 0,
    ) -> None:
        if budget <= num_restore:
            raise ValueError(
                f"model.budget: {budget} tokens per KV head leave no room beside {num_restore} restore tokens"
            )
        super().__init__(optim)
        self.save_hyperparameters()
        self.restore: RestoreAdapter | None = None
        self.press: RestoreKVPress | None = None

    def configure_model(self) -> None:
        """Load the frozen LLM and attach the restore module (and the press that evicts for the student)."""
        if self.restore is not None:
            return
        hp = self.hparams
        backbone = self.load_frozen_backbone(load_backbone)
        if self.label_setting != "aware":
            # an agnostic row holds a context and its answers without the questions asked between them
            raise ValueError(
                "data: RestoreKV distils the response read right after its prompt, so it trains on aware "
                f"labels (the question inside the prompt); these label folders are {self.label_setting} "
                "(their rows hold the context and its answers without the questions): label with "
                "`lkv label --label_mode aware`"
            )
        self.restore = RestoreAdapter.create(
            backbone,
            num_tokens=hp.num_restore,
            lora_rank=hp.lora_rank,
            lora_alpha=hp.lora_alpha,
            lora_dropout=hp.lora_dropout,
            target_modules=hp.lora_targets,
            init=hp.restore_init,
            seed=hp.seed,
            adapter_name=RESTORE_ADAPTER,
        )
        self.restore.config.base_model = self.signature.to_dict()
        self.press = RestoreKVPress(self.restore, KVzipPress(hp.chunk_size, hp.overlap))

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """State-dict key → parameter of the restore embeddings and the LoRA weights."""
        return {f"restore.{name}": p for name, p in self.restore.trainable_parameters().items()}

    def describe(self) -> str:
        return f"restore module ({self.hparams.model}, n={self.hparams.num_restore})"

    def distillation(self, sample: Sample, restored: bool = True) -> torch.Tensor | None:
        """KL(teacher ‖ student) of one sample, averaged over its response tokens after the first; ``None``
        when the budget holds the prompt (nothing evicted) or the response has a single token.

        Args:
            restored: the student's cache is KVzip's ``C − n`` entries + the restore K/V (with grad when
                enabled); False: KVzip's ``C`` entries alone (the reference line, no grad needed).
        """
        model = self.restore.base_model
        ids = sample["prompt_ids"][None].to(self.device)
        response = sample["response_ids"][None].to(self.device)
        prompt_len, budget = ids.shape[1], self.hparams.budget
        if budget >= prompt_len or response.shape[1] < 2:
            return None
        with torch.no_grad():
            cache, logits = prefill(model, ids)
            scores = self.press.score(PressContext(model, ids, cache, logits, tokenizer=self.tokenizer))
            layer_budgets = (
                self.press.layer_budgets(budget, prompt_len, len(cache.layers))
                if restored
                else [budget] * len(cache.layers)
            )
            kept = select_indices(scores, layer_budgets)
            teacher = _answer(model, copy.deepcopy(cache), response[:, :-1], prompt_len)
        student_cache = gather_cache(cache, kept, in_place=False)
        first = prompt_len
        if restored:
            appended = self.restore.restore(cache, prompt_len)
            append_entries(student_cache, appended)
            first += appended.length
        student = _answer(model, student_cache, response[:, :-1], first)
        log_teacher = torch.log_softmax(teacher, dim=-1)
        log_student = torch.log_softmax(student, dim=-1)
        return (log_teacher.exp() * (log_teacher - log_student)).sum(-1).mean()

    def training_step(self, batch: list[Sample], batch_idx: int) -> torch.Tensor | None:
        losses = [loss for loss in (self.distillation(sample) for sample in batch) if loss is not None]
        if not losses:
            return None  # every prompt fits the budget: nothing to restore
        loss = torch.stack(losses).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        self.log(
            "train/prompt_tokens", float(sum(s["prompt_ids"].numel() for s in batch)), batch_size=len(batch)
        )
        return loss

    @torch.no_grad()
    def _log_distillation(self, batch: list[Sample], stage: str) -> dict[str, Any]:
        """``<stage>/kl`` (KVzip + restore tokens) and ``<stage>/kvzip_kl`` (KVzip alone at ``C``) of a batch."""
        for restored, name in ((True, "kl"), (False, "kvzip_kl")):
            values = [v for v in (self.distillation(s, restored) for s in batch) if v is not None]
            if values:
                self.log(f"{stage}/{name}", torch.stack(values).mean(), batch_size=len(values))
        return {}

    def validation_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._log_distillation(batch, "val")

    def test_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._log_distillation(batch, "test")

    def hparams_metrics(self) -> list[str]:
        """``val/kl`` (with the restore tokens) and ``val/kvzip_kl`` (the reference line)."""
        return ["val/kl", "val/kvzip_kl"]


def _answer(model, cache: DynamicCache, tokens: torch.Tensor, first: int) -> torch.Tensor:
    """``(T, vocab)`` fp32 next-token logits of ``tokens (1, T)`` read after ``cache``, at positions ``first,
    first+1, ...`` (the response teacher-forced)."""
    positions = torch.arange(first, first + tokens.shape[1], device=tokens.device)[None]
    out = model(input_ids=tokens, position_ids=positions, **cache_kwargs(cache), use_cache=True)
    return out.logits[0].float()
