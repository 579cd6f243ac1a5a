"""The LookaheadKV LightningModule: frozen LLM + lookahead module, two-phase training step, ranking metrics.

Per sample (docs/design.md §1, "Two-phase training step"):

1. prefill the prompt with the adapter off under ``no_grad`` (LM head on the last position only);
2. ground truth: the label's stored scores, or — for a responses-only label folder — the response
   teacher-forced on that same cache (:func:`lkv.labels.labeller.response_importance`, crops back);
3. :meth:`LookaheadAdapter.predict`: the ``M`` lookahead tokens with the adapter on and grad;
4. loss = mean over (layer, KV head) of KL(s_GT ‖ s_LKV); backward runs through the ``M`` tokens only.

Validation adds SnapKV's scores from an observation-window capture taken during the same prefill, and
logs ``val/kl``, ``val/recall@C``, ``val/kendall_tau``, ``val/snapkv_recall@C``, ``val/snapkv_kendall_tau``.
A fit names the first three as the metrics of its TensorBoard HParams session (:meth:`on_fit_start`), so
the HParams tab ranks runs by their last validation values.
Checkpoints hold only the trainable weights (and optimiser state); the frozen LLM is reloaded by
:meth:`configure_model`.

With :attr:`LookaheadKVModule.share_prefill` set (by :class:`lkv.train.ablation.LookaheadAblation`), the
training and validation steps also return every sample's prefill as a :class:`SharedPrefill` (``outputs
["prefills"]``), so other lookahead modules can run their own steps on it without prefilling again.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from transformers import DynamicCache
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from lkv.core.attention import ImportanceCapture
from lkv.core.generation import prefill
from lkv.core.importance import response_importance
from lkv.core.metrics import importance_loss, ranking_metrics
from lkv.eval.tensorboard import hparams_session
from lkv.eviction.presses.snapkv import snapkv_scores
from lkv.model.backbone import DEFAULT_MODEL, ModelSignature, load_backbone, model_signature
from lkv.model.lookahead import LookaheadAdapter
from lkv.train.datamodule import Sample


def draw_position_offset(max_offset: int, seed: int, epoch: int, batch_idx: int, index: int) -> int:
    """The lookahead position offset of sample ``index`` of batch ``batch_idx`` in ``epoch``: uniform on
    ``{0, …, max_offset}``, a function of its arguments only (a resumed fit, and a sibling module with the same
    seed, draw the same offsets)."""
    if max_offset == 0:
        return 0
    return random.Random(f"lkv-offset:{seed}:{epoch}:{batch_idx}:{index}").randint(0, max_offset)


def draw_position_gap(
    max_gap: int, seed: int, epoch: int, batch_idx: int, index: int, prompt_len: int
) -> tuple[int, int]:
    """``(cut, g)`` of the position gap of a sample (as :func:`draw_position_offset`): ``cut ~ U{0..S}``,
    ``g ~ U{0..max_gap}``; ``(0, 0)`` when ``max_gap`` is 0."""
    if max_gap == 0:
        return 0, 0
    rng = random.Random(f"lkv-gap:{seed}:{epoch}:{batch_idx}:{index}")
    return rng.randint(0, prompt_len), rng.randint(0, max_gap)


def adapter_settings(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The :meth:`LookaheadAdapter.create` arguments of a module's hyper-parameters (``num_lookahead`` → ``num_tokens``,
    ``lora_targets`` → ``target_modules``, ...); sibling modules of an in-run ablation are built from here too."""
    return {
        "num_tokens": hparams["num_lookahead"],
        "lora_rank": hparams["lora_rank"],
        "lora_alpha": hparams["lora_alpha"],
        "lora_dropout": hparams["lora_dropout"],
        "target_modules": hparams["lora_targets"],
        "init": hparams["lookahead_init"],
        "seed": hparams["seed"],
    }


def training_loss(target: torch.Tensor, pred: torch.Tensor, hparams: Mapping[str, Any]) -> torch.Tensor:
    """Per-row training loss ``(..., S) → (...)`` of a module's hyper-parameters (the KL, plus the top-``C``
    term when ``topc_loss_weight`` > 0); sibling modules of an in-run ablation use it with their own."""
    return importance_loss(target, pred, hparams["topc_loss_weight"], hparams["topc_loss_budget"])


@dataclass
class SharedPrefill:
    """One sample's prompt prefill (adapter off) and ground truth, after the module's own lookahead step.

    Attributes:
        cache: the prompt's cache, cropped back to exactly ``S`` entries per layer and free of the module's
            graph: another module's :meth:`LookaheadAdapter.predict` may run on it (and crops back again).
        target: ``(layers, kv_heads, S)`` float32 s_GT.
        position_offset: how far the prompt's last positions were moved (a position gap): lookahead tokens
            on this cache start at ``S + position_offset``.
    """

    cache: DynamicCache
    target: torch.Tensor
    position_offset: int = 0

    @property
    def prompt_len(self) -> int:
        return self.target.shape[-1]


class LookaheadKVModule(L.LightningModule):
    """Trains ``M`` lookahead embeddings and a LoRA adapter to predict a frozen LLM's future attention.

    Args:
        model: base LLM: embedded short name (``smollm2-135m``), local folder, ``.gguf`` file or hub id.
        dtype: weights dtype of the frozen LLM (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: attention of the frozen LLM: ``sdpa`` or ``eager`` (``flex_attention`` is refused).
        num_lookahead: ``M``, lookahead embeddings (paper: 32).
        lookahead_init: ``vocab_mean``, ``random_tokens`` or ``normal`` (see :func:`lkv.model.lookahead.init_embeddings`).
        lora_rank, lora_alpha, lora_dropout: LoRA settings (paper: 8, 32, 0).
        lora_targets: ``all-linear`` (q,k,v,o,gate,up,down), a list of module names, or ``none`` to train
            the embeddings alone.
        lr: peak learning rate.
        betas: Adam betas (paper: 0.9, 0.95).
        weight_decay: decoupled weight decay (0 = plain Adam).
        warmup_steps: optimiser steps of linear warm-up from 0.
        scheduler: ``cosine`` (decay to ``min_lr_ratio · lr`` at the last step) or ``constant``.
        min_lr_ratio: final learning rate of the cosine schedule, as a fraction of ``lr``.
        eval_budgets: budgets C of the validation Recall@C.
        snapkv_window, snapkv_kernel: SnapKV settings of the reference line (paper: 32, 7, max-pool).
        seed: seed of the embedding and LoRA initialisation (and of the position offsets).
        max_position_offset: position-offset augmentation: each training sample's lookahead tokens sit a random
            ``o ~ U{0..max_position_offset}`` positions past the prompt (:meth:`LookaheadAdapter.predict`), so
            prompts of ~1K tokens teach the query–key distances of prompts up to ~1K + this; 0 = off.
            Validation and inference use no offset.
        max_position_gap: position-gap augmentation: each training prompt is prefilled with its positions from a
            random cut ``k ~ U{0..S}`` on moved ``g ~ U{0..max_position_gap}`` further (and the lookahead tokens with
            them), so the tokens before the cut sit ``g`` further from the question and from the lookahead queries
            while the prompt's end stays next to them: a short prompt shaped like a long one whose answer is far
            from the end. The labels (the response's attention without the gap) are kept; a responses-only label's
            ground truth is computed on the gapped prefill. Validation and inference use no gap. Unlike
            ``max_position_offset`` it changes the shared prefill, so an in-run ablation cannot vary it.
        topc_loss_weight, topc_loss_budget: the weight of a top-``C`` term added to the KL
            (:func:`lkv.core.metrics.importance_loss`: ``−log`` of the predicted mass on the true top-``C``
            positions of each (layer, KV head)); 0 = the paper's KL alone.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        num_lookahead: int = 32,
        lookahead_init: Literal["vocab_mean", "random_tokens", "normal"] = "vocab_mean",
        lora_rank: int = 8,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        lora_targets: list[str] | str = "all-linear",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        scheduler: Literal["cosine", "constant"] = "cosine",
        min_lr_ratio: float = 0.1,
        eval_budgets: tuple[int, ...] = (32, 64, 128),
        snapkv_window: int = 32,
        snapkv_kernel: int = 7,
        seed: int = 0,
        max_position_offset: int = 0,
        max_position_gap: int = 0,
        topc_loss_weight: float = 0.0,
        topc_loss_budget: int = 64,
    ) -> None:
        super().__init__()
        if not eval_budgets or min(eval_budgets) <= 0:
            raise ValueError(
                f"model.eval_budgets: expected positive budgets C (tokens), found {list(eval_budgets)}"
            )
        if topc_loss_weight < 0 or topc_loss_budget <= 0:
            raise ValueError(
                f"model.topc_loss_weight must be ≥ 0 and model.topc_loss_budget positive, found "
                f"{topc_loss_weight} and {topc_loss_budget}"
            )
        if max_position_offset < 0 or max_position_gap < 0:
            raise ValueError(
                f"model.max_position_offset and model.max_position_gap: expected ≥ 0 positions, found "
                f"{max_position_offset} and {max_position_gap}"
            )
        self.save_hyperparameters()
        # Checkpoints carry only the trainable weights; the frozen LLM comes from `configure_model`.
        self.strict_loading = False
        self.adapter: LookaheadAdapter | None = None
        # Return each step's prefills in its outputs (for sibling modules); off: caches are freed at once.
        self.share_prefill = False
        self.tokenizer = None
        self.signature: ModelSignature | None = None
        budgets = list(eval_budgets)
        self.val_metrics = ranking_metrics(budgets, "val/")
        self.val_snapkv = ranking_metrics(budgets, "val/snapkv_", kl=False)
        self.test_metrics = ranking_metrics(budgets, "test/")
        self.test_snapkv = ranking_metrics(budgets, "test/snapkv_", kl=False)

    def configure_model(self) -> None:
        """Load the frozen LLM, check it against the label folders, and attach the lookahead module."""
        if self.adapter is not None:
            return
        hp = self.hparams
        device = self._trainer.strategy.root_device if self._trainer is not None else None
        backbone, self.tokenizer = load_backbone(
            hp.model, dtype=hp.dtype, attn_implementation=hp.attn_implementation, device=device
        )
        self.signature = model_signature(backbone, self.tokenizer, hp.model)
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        if hasattr(datamodule, "check_model"):
            datamodule.check_model(self.signature)
        self.adapter = LookaheadAdapter.create(backbone, **adapter_settings(hp))
        self.adapter.config.base_model = self.signature.to_dict()

    def importance(
        self, sample: Sample, snapkv: bool = False, position_offset: int = 0, gap: tuple[int, int] = (0, 0)
    ) -> dict[str, torch.Tensor]:
        """Predicted and true importance of one sample, sharing one prefill.

        Args:
            position_offset: the lookahead tokens' position offset (:meth:`LookaheadAdapter.predict`).
            gap: ``(cut, g)``: prompt positions from ``cut`` on, and the lookahead tokens, move ``g`` further
                (``max_position_gap``); ``(0, 0)``: none.

        Returns:
            ``pred`` and ``target`` ``(layers, kv_heads, S)``; ``cache``, the prompt's cache (cropped back);
            with ``snapkv``, also ``snapkv_window``, the normalised attention of the last ``snapkv_window``
            prompt queries ``(layers, kv_heads, S)``.
        """
        ids = sample["prompt_ids"][None]
        prompt_len = ids.shape[1]
        model = self.adapter.model
        capture = ImportanceCapture(prompt_len, last_queries=self.hparams.snapkv_window) if snapkv else None
        cut, moved = gap
        positions = torch.arange(prompt_len, device=ids.device)
        positions[cut:] += moved
        kwargs = {"lkv_capture": capture} if snapkv else {}
        cache, _ = prefill(model, ids, position_ids=positions[None], **kwargs)
        target = sample["scores"]
        if target is None:
            response = sample["response_ids"][None]
            target = response_importance(model, cache, prompt_len, response, position_offset=moved)
        pred = self.adapter.predict(cache, prompt_len, position_offset + moved)[0]
        out = {"target": target.float(), "pred": pred, "cache": cache}
        if snapkv:
            out["snapkv_window"] = capture.scores(model.config.num_hidden_layers)[0]
        return out

    def training_step(self, batch: list[Sample], batch_idx: int) -> torch.Tensor | dict[str, Any]:
        losses, prefills = [], []
        for index, sample in enumerate(batch):
            hp = self.hparams
            offset = draw_position_offset(
                hp.max_position_offset, hp.seed, self.current_epoch, batch_idx, index
            )
            gap = draw_position_gap(
                hp.max_position_gap, hp.seed, self.current_epoch, batch_idx, index, len(sample["prompt_ids"])
            )
            scores = self.importance(sample, position_offset=offset, gap=gap)
            losses.append(training_loss(scores["target"], scores["pred"], hp).mean())
            prefills.append(SharedPrefill(scores["cache"], scores["target"], gap[1]))
        loss = torch.stack(losses).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        self.log(
            "train/prompt_tokens", float(sum(s["prompt_ids"].numel() for s in batch)), batch_size=len(batch)
        )
        return {"loss": loss, "prefills": prefills} if self.share_prefill else loss

    def _evaluate(self, batch: list[Sample], metrics, snapkv_metrics) -> dict[str, Any]:
        hp = self.hparams
        prefills = []
        for sample in batch:
            scores = self.importance(sample, snapkv=True)
            metrics.update(scores["pred"], scores["target"])
            snap = snapkv_scores(scores["snapkv_window"], hp.snapkv_window, hp.snapkv_kernel)
            snapkv_metrics.update(snap, scores["target"])
            prefills.append(SharedPrefill(scores.pop("cache"), scores["target"]))
        self.log_dict(metrics, batch_size=len(batch))
        self.log_dict(snapkv_metrics, batch_size=len(batch))
        # The last sample's scores, for callbacks that plot them.
        return {"id": batch[-1]["id"], **scores, **({"prefills": prefills} if self.share_prefill else {})}

    def validation_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.val_metrics, self.val_snapkv)

    def test_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.test_metrics, self.test_snapkv)

    def hparams_metrics(self) -> list[str]:
        """The validation metrics that rank fit runs in TensorBoard's HParams tab."""
        return ["val/kl", *(f"val/recall@{c}" for c in self.hparams.eval_budgets), "val/kendall_tau"]

    def on_fit_start(self) -> None:
        # An HParams session (model.* and data.* settings, named metrics) in every TensorBoard run. Written
        # before Lightning's own hyper-parameter logging: TensorBoard keeps a run's first session, so a
        # logger left with `default_hp_metric` still shows these metrics, not its `hp_metric` placeholder.
        # A trainer with `enable_autolog_hparams: false` (`lkv sweep` points, which log their own) gets none.
        if not (self.trainer.enable_autolog_hparams and self.trainer.is_global_zero):
            return
        params = {f"model.{k}": v for k, v in self.hparams.items() if not k.startswith("_")}
        datamodule = self.trainer.datamodule
        if datamodule is not None:
            params |= {f"data.{k}": v for k, v in datamodule.hparams.items() if not k.startswith("_")}
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                for summary in hparams_session(params, self.hparams_metrics()):
                    logger.experiment.file_writer.add_summary(summary)

    def on_train_epoch_start(self) -> None:
        datamodule = self.trainer.datamodule
        if hasattr(datamodule, "set_epoch"):
            datamodule.set_epoch(self.current_epoch)

    def configure_optimizers(self) -> dict[str, Any]:
        return self.optimizer_for(list(self.adapter.trainable_parameters().values()))

    def optimizer_for(self, params: list[torch.nn.Parameter]) -> dict[str, Any]:
        """The module's AdamW and per-step learning-rate schedule over ``params`` (Lightning's optimiser dict);
        sibling lookahead modules (:mod:`lkv.train.ablation`) get theirs from here too."""
        hp = self.hparams
        optimizer = torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        if hp.scheduler == "cosine":
            total = self.trainer.estimated_stepping_batches
            if total == float("inf"):
                raise ValueError(
                    "the cosine schedule needs a known length: set trainer.max_steps (a streamed label set "
                    "has no length), or use model.scheduler=constant"
                )
            total = int(total)
            schedule = get_cosine_with_min_lr_schedule_with_warmup(
                optimizer, hp.warmup_steps, max(total, hp.warmup_steps + 1), min_lr_rate=hp.min_lr_ratio
            )
        elif hp.scheduler == "constant":
            schedule = get_constant_schedule_with_warmup(optimizer, hp.warmup_steps)
        else:
            raise ValueError(f"scheduler must be 'cosine' or 'constant', got {hp.scheduler!r}")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def trainable_state_names(self) -> set[str]:
        """State-dict keys of the trainable weights (lookahead embeddings + LoRA)."""
        return {f"adapter.{name}" for name in self.adapter.trainable_parameters()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keep = self.trainable_state_names()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # `load_from_checkpoint` calls this before `load_state_dict`: build the model the weights belong to.
        self.configure_model()
        expected = self.trainable_state_names()
        found = set(checkpoint["state_dict"])
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match this lookahead module ({self.hparams.model}, "
                f"lora_targets={self.hparams.lora_targets}): {len(missing)} trainable weights missing "
                f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]})"
            )
        # The frozen weights are the ones just loaded: hand them back (by reference) so loading matches the
        # whole state dict instead of reporting every frozen tensor as missing.
        frozen = {k: v for k, v in self.state_dict().items() if k not in expected}
        checkpoint["state_dict"] = {**frozen, **checkpoint["state_dict"]}
