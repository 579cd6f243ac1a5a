"""What every trained importance predictor shares: one prefill per sample, the loss against s_GT, and the ranking
metrics (beside what every module trained next to a frozen LLM shares: :class:`lkv.train.frozen.FrozenLLMModule`).

A predictor (:class:`lkv.train.module.LookaheadKVModule`, :class:`lkv.train.probe_module.ProbeModule`) loads
its frozen LLM in :meth:`~lightning.pytorch.core.hooks.ModelHooks.configure_model` and defines
:meth:`ImportanceModule.importance` (predicted and true ``(layers, kv_heads, S)`` importance of one sample,
from one prefill: :meth:`ImportanceModule.prefill_sample`) and :meth:`ImportanceModule.trainable_parameters`.
Everything else is here, so the modules train, validate, log and checkpoint alike and their runs compare in
TensorBoard:

- training: ``train/loss`` = mean over samples of :meth:`ImportanceModule.loss` (by default mean over
  (layer, KV head) of KL(s_GT ‖ predicted), docs/design.md §1) and ``train/prompt_tokens``;
- validation and test: ``val/kl``, ``val/recall@C``, ``val/kendall_tau`` and SnapKV's reference line
  ``val/snapkv_recall@C``, ``val/snapkv_kendall_tau`` from an observation-window capture of the same prefill;
  a fit names the first three as the metrics of its TensorBoard HParams session;
- predictors trained beside the main one on the same prefill (a lookahead module's probe): their losses
  (:meth:`side_losses`, logged as ``train/<name>``) join the backpropagated loss, their validation metrics
  (:meth:`side_metrics`) are logged beside the main one's, their weights form parameter groups of their own
  (:meth:`~lkv.train.frozen.FrozenLLMModule.param_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchmetrics import MetricCollection
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import AttentionCapture, ImportanceCapture
from lkv.core.budget import token_budgets
from lkv.core.generation import prefill
from lkv.core.importance import response_importance
from lkv.core.metrics import importance_kl, ranking_metrics
from lkv.eviction.presses.snapkv import snapkv_scores
from lkv.train.datamodule import Sample
from lkv.train.frozen import FrozenLLMModule
from lkv.train.optim import OptimSettings, ParamGroup, build_optimizer


@dataclass
class SharedPrefill:
    """One sample's prompt prefill (adapter off) and ground truth, after the module's own step.

    Attributes:
        cache: the prompt's cache, cropped back to exactly ``S`` entries per layer and free of the module's
            graph: another module's :meth:`LookaheadAdapter.predict` may run on it (and crops back again).
        target: ``(layers, kv_heads, S)`` float32 s_GT.
        position_offset: how far the prompt's last positions were moved (a position gap,
            :meth:`ImportanceModule.prefill_sample`): lookahead tokens on this cache start at
            ``S + position_offset``.
    """

    cache: DynamicCache
    target: torch.Tensor
    position_offset: int = 0

    @property
    def prompt_len(self) -> int:
        return self.target.shape[-1]


class ImportanceModule(FrozenLLMModule):
    """Base of the trained importance predictors (see the module docstring for what it provides).

    The subclass's ``__init__`` calls ``super().__init__(eval_budgets, optim)`` then ``self.save_hyperparameters()``,
    and its hyper-parameters include those of :class:`~lkv.train.frozen.FrozenLLMModule`, ``eval_budgets``,
    ``snapkv_window`` and ``snapkv_kernel``.

    Attributes:
        share_prefill: return each step's prefills in its outputs (``outputs["prefills"]``, for sibling
            lookahead modules: :class:`lkv.sweep.ablation.LookaheadAblation`); off, caches are freed at once.
        prediction_name: what the predicted importance is called in plots (``val/importance``).
    """

    prediction_name = "prediction"

    def __init__(self, eval_budgets: Sequence[int], optim: OptimSettings) -> None:
        super().__init__(optim)
        self.share_prefill = False
        budgets = list(token_budgets(eval_budgets, "model.eval_budgets"))
        self.val_metrics = ranking_metrics(budgets, "val/")
        self.val_snapkv = ranking_metrics(budgets, "val/snapkv_", kl=False)
        self.test_metrics = ranking_metrics(budgets, "test/")
        self.test_snapkv = ranking_metrics(budgets, "test/snapkv_", kl=False)

    # --- what a predictor defines ------------------------------------------------------------------------

    def importance(self, sample: Sample, snapkv: bool = False) -> dict[str, torch.Tensor]:
        """Predicted and true importance of one sample, sharing one prefill.

        Returns:
            ``pred`` and ``target`` ``(layers, kv_heads, S)`` (``pred`` a distribution over ``S``); ``cache``,
            the prompt's cache (cropped back); with ``snapkv``, also ``snapkv_window`` (see
            :meth:`prefill_sample`); a predictor may add what its :meth:`loss` needs.
        """
        raise NotImplementedError

    def side_losses(self, sample: Sample, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Name → one sample's loss of each predictor trained beside this one on the same prefill (none by
        default). Their parameters are disjoint from this predictor's, so adding the losses leaves this
        predictor's gradients exactly as they are alone."""
        return {}

    def side_metrics(self, stage: str) -> dict[str, MetricCollection]:
        """Key of :meth:`importance`'s result → the ranking metrics of ``stage`` (``val`` or ``test``) that
        score that prediction against s_GT, for predictors trained beside this one (none by default)."""
        return {}

    def loss(self, sample: Sample, scores: dict[str, torch.Tensor]) -> torch.Tensor:
        """One sample's training loss: mean over (layer, KV head) of KL(s_GT ‖ predicted)."""
        return importance_kl(scores["target"], scores["pred"]).mean()

    def training_importance(self, sample: Sample, batch_idx: int, index: int) -> dict[str, torch.Tensor]:
        """:meth:`importance` of sample ``index`` of training batch ``batch_idx``; a predictor with training-only
        augmentations draws them here. Its result may carry ``position_offset`` (see :class:`SharedPrefill`)."""
        return self.importance(sample)

    # --- shared -------------------------------------------------------------------------------------------

    def prefill_sample(
        self,
        model: PreTrainedModel,
        sample: Sample,
        snapkv: bool = False,
        captures: Sequence[AttentionCapture] = (),
        gap: tuple[int, int] = (0, 0),
    ) -> tuple[SharedPrefill, torch.Tensor | None]:
        """Prefill one sample's prompt with ``model`` (no grad) and get its ground truth.

        Args:
            captures: further captures of the same prefill (e.g. a probe's attention inputs).
            gap: ``(cut, g)``: the prompt's positions from ``cut`` on move ``g`` further (a position gap:
                the tokens before the cut sit ``g`` further from the end); ``(0, 0)``: none.

        Returns:
            The prefill (cache + float32 s_GT: the label's stored scores, or — for a responses-only label
            folder — the response teacher-forced on that same cache) and, with ``snapkv``, the normalised
            attention of the last ``snapkv_window`` prompt queries ``(layers, kv_heads, S)``, else ``None``.
        """
        ids = sample["prompt_ids"][None]
        prompt_len = ids.shape[1]
        window = ImportanceCapture(prompt_len, last_queries=self.hparams.snapkv_window) if snapkv else None
        listed = [c for c in (window, *captures) if c is not None]
        cut, moved = gap
        kwargs = {"lkv_capture": listed} if listed else {}
        if moved:
            positions = torch.arange(prompt_len, device=ids.device)
            positions[cut:] += moved
            kwargs["position_ids"] = positions[None]
        cache, _ = prefill(model, ids, **kwargs)
        target = sample["scores"]
        if target is None:
            response = sample["response_ids"][None]
            target = response_importance(model, cache, prompt_len, response, position_offset=moved)
        window_scores = None if window is None else window.scores(model.config.num_hidden_layers)[0]
        return SharedPrefill(cache, target.float(), moved), window_scores

    def training_step(self, batch: list[Sample], batch_idx: int) -> torch.Tensor | dict[str, Any]:
        losses, side, prefills = [], {}, []
        for index, sample in enumerate(batch):
            scores = self.training_importance(sample, batch_idx, index)
            losses.append(self.loss(sample, scores))
            for name, value in self.side_losses(sample, scores).items():
                side.setdefault(name, []).append(value)
            prefills.append(
                SharedPrefill(scores["cache"], scores["target"], scores.get("position_offset", 0))
            )
        loss = torch.stack(losses).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        total = loss
        for name, values in side.items():
            side_loss = torch.stack(values).mean()
            self.log(f"train/{name}", side_loss, batch_size=len(batch))
            total = total + side_loss
        self.log(
            "train/prompt_tokens", float(sum(s["prompt_ids"].numel() for s in batch)), batch_size=len(batch)
        )
        return {"loss": total, "prefills": prefills} if self.share_prefill else total

    def _evaluate(self, batch: list[Sample], metrics, snapkv_metrics, stage: str) -> dict[str, Any]:
        hp = self.hparams
        side = self.side_metrics(stage)
        prefills = []
        for sample in batch:
            scores = self.importance(sample, snapkv=True)
            metrics.update(scores["pred"], scores["target"])
            snap = snapkv_scores(scores["snapkv_window"], hp.snapkv_window, hp.snapkv_kernel)
            snapkv_metrics.update(snap, scores["target"])
            for key, side_metrics in side.items():
                side_metrics.update(scores[key], scores["target"])
            prefills.append(SharedPrefill(scores.pop("cache"), scores["target"]))
        for collection in (metrics, snapkv_metrics, *side.values()):
            self.log_dict(collection, batch_size=len(batch))
        # The last sample's scores, for callbacks that plot them.
        return {"id": batch[-1]["id"], **scores, **({"prefills": prefills} if self.share_prefill else {})}

    def validation_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.val_metrics, self.val_snapkv, "val")

    def test_step(self, batch: list[Sample], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.test_metrics, self.test_snapkv, "test")

    def hparams_metrics(self) -> list[str]:
        """``val/kl``, ``val/recall@C`` of every evaluation budget and ``val/kendall_tau``."""
        return ["val/kl", *(f"val/recall@{c}" for c in self.hparams.eval_budgets), "val/kendall_tau"]

    def optimizer_for(self, params: list[torch.nn.Parameter]) -> dict[str, Any]:
        """An AdamW and per-step schedule over ``params`` with this module's ``optim`` settings (Lightning's
        optimiser dict), for sibling lookahead modules (:mod:`lkv.sweep.ablation`)."""
        return build_optimizer(
            [ParamGroup("module", params, self.optim)], self.trainer.estimated_stepping_batches
        )
