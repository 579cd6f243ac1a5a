"""What every module lkv trains beside a frozen LLM shares: loading that LLM, the optimiser, per-group gradient
clipping, checkpoints that hold only the trained weights, and the TensorBoard HParams session of a fit.

Its subclasses are the importance predictors (:class:`lkv.train.base.ImportanceModule`: their steps, loss and
ranking metrics) and RestoreKV's restore tokens (:class:`lkv.train.restore_module.RestoreKVModule`: steps and
metrics of their own); a fit config's ``model: {class_path: ...}`` may name any of them (:mod:`lkv.train.cli`).

- AdamW with a cosine or constant schedule per optimiser step (``model.optim``, :mod:`lkv.train.optim`), one
  parameter group per part trained in the fit (:meth:`FrozenLLMModule.param_groups`), each clipped alone;
- checkpoints trimmed to :meth:`FrozenLLMModule.trainable_parameters` (the frozen LLM is reloaded by
  ``configure_model``), with the prompt setting of the labels trained on;
- an HParams session (``model.*`` and ``data.*`` settings) ranking the run by
  :meth:`FrozenLLMModule.hparams_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from transformers import PreTrainedModel

from lkv.core.tensorboard import hparams_session
from lkv.model.backbone import ModelSignature, model_signature
from lkv.train.optim import OptimSettings, ParamGroup, as_settings, build_optimizer, clip_gradients

# the checkpoint entry holding the prompt setting of the labels the module trained on (`aware`, `agnostic`)
CHECKPOINT_SETTING = "label_setting"


class FrozenLLMModule(L.LightningModule):
    """Base of the modules that train a few weights beside a frozen LLM (module docstring).

    The subclass's ``__init__`` calls ``super().__init__(optim)`` then ``self.save_hyperparameters()``; its
    hyper-parameters include ``model``, ``dtype``, ``attn_implementation`` (:meth:`load_frozen_backbone`) and
    ``optim`` (:class:`~lkv.train.optim.OptimSettings`). It defines ``configure_model`` (load the LLM, attach
    what trains), :meth:`trainable_parameters`, :meth:`hparams_metrics` and its steps.

    Attributes:
        optim: the AdamW settings, a dataclass (a checkpoint's hyper-parameters keep what LightningCLI parsed,
            a dict).
        tokenizer, signature: the frozen LLM's, once :meth:`load_frozen_backbone` ran.
        label_setting: the prompt setting of the labels it trains on (``aware`` or ``agnostic``, from the
            datamodule), kept in checkpoints and written by `lkv export` into the exported config; a checkpoint
            from before it was kept counts as ``aware``.
    """

    def __init__(self, optim: OptimSettings) -> None:
        # `optim` is typed as the plain dataclass: for a `model.class_path` config, jsonargparse first parses
        # this signature and carries the values it finds into the chosen subclass's arguments. A dataclass
        # gives an empty group there (the subclass's default fills it); a union (`OptimSettings | dict`) gives
        # `optim=None` (or, with a default, that default's fields), which would replace the subclass's default.
        super().__init__()
        self.optim = as_settings(optim, OptimSettings, "model.optim")
        # Checkpoints carry only the trainable weights; the frozen LLM comes from `configure_model`.
        self.strict_loading = False
        self.tokenizer = None
        self.signature: ModelSignature | None = None
        self.label_setting = "aware"

    # --- what a subclass defines -------------------------------------------------------------------------

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """State-dict key → parameter of everything that trains (what checkpoints keep)."""
        raise NotImplementedError

    def hparams_metrics(self) -> list[str]:
        """The validation metrics that rank fit runs in TensorBoard's HParams tab."""
        raise NotImplementedError

    def param_groups(self) -> list[ParamGroup]:
        """The optimiser's parameter groups: by default one, every trainable weight with ``model.optim``."""
        return [ParamGroup("module", list(self.trainable_parameters().values()), self.optim)]

    def describe(self) -> str:
        """What this module is, for error messages (e.g. ``lookahead module (smollm2-135m, ...)``)."""
        return f"{type(self).__name__} ({self.hparams.model})"

    # --- shared -------------------------------------------------------------------------------------------

    def load_frozen_backbone(self, loader: Callable[..., tuple[PreTrainedModel, Any]]) -> PreTrainedModel:
        """Load the frozen LLM with ``loader`` (:func:`lkv.model.backbone.load_backbone`, passed by the
        subclass's module so tests can replace it there) onto the trainer's device, keep its tokenizer and
        signature, check it against the label folders and take their setting (one for all of them)."""
        hp = self.hparams
        device = self._trainer.strategy.root_device if self._trainer is not None else None
        backbone, self.tokenizer = loader(
            hp.model, dtype=hp.dtype, attn_implementation=hp.attn_implementation, device=device
        )
        self.signature = model_signature(backbone, self.tokenizer, hp.model)
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        if hasattr(datamodule, "check_model"):
            datamodule.check_model(self.signature)
        if hasattr(datamodule, "label_setting"):
            self.label_setting = datamodule.label_setting()
        return backbone

    def on_fit_start(self) -> None:
        # An HParams session (model.* and data.* settings, named metrics) in every TensorBoard run. Written
        # before Lightning's own hyper-parameter logging: TensorBoard keeps a run's first session, so a
        # logger left with `default_hp_metric` still shows these metrics, not its `hp_metric` placeholder.
        # A trainer with `enable_autolog_hparams: false` (`lkv sweep` points, which log their own) gets none.
        if not (self.trainer.enable_autolog_hparams and self.trainer.is_global_zero):
            return
        params = _flat({k: v for k, v in self.hparams.items() if not k.startswith("_")}, "model.")
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
        return build_optimizer(self.param_groups(), self.trainer.estimated_stepping_batches)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip each parameter group alone (one group: Lightning's own clipping), so a part trained beside
        another never changes how the other's gradients are clipped."""
        if not gradient_clip_val:
            return
        for group in optimizer.param_groups:
            clip_gradients(group["params"], gradient_clip_val, gradient_clip_algorithm)

    def trainable_state_names(self) -> set[str]:
        """State-dict keys of the trainable weights."""
        return set(self.trainable_parameters())

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keep = self.trainable_state_names()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}
        checkpoint[CHECKPOINT_SETTING] = self.label_setting

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # `load_from_checkpoint` calls this before `load_state_dict`: build the model the weights belong to.
        self.configure_model()
        self.label_setting = checkpoint.get(CHECKPOINT_SETTING, "aware")
        expected = self.trainable_state_names()
        found = set(checkpoint["state_dict"])
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match this {self.describe()}: {len(missing)} trainable weights missing "
                f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]})"
            )
        # The frozen weights are the ones just loaded: hand them back (by reference) so loading matches the
        # whole state dict instead of reporting every frozen tensor as missing.
        frozen = {k: v for k, v in self.state_dict().items() if k not in expected}
        checkpoint["state_dict"] = {**frozen, **checkpoint["state_dict"]}


def _flat(params: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``params`` with every dataclass value (``optim``, ``probe``) spread into ``prefix.key.field`` entries."""
    flat = {}
    for key, value in params.items():
        if is_dataclass(value) and not isinstance(value, type):
            flat |= _flat(asdict(value), f"{prefix}{key}.")
        elif isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
