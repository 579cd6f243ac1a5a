"""The per-token probe's LightningModule (KVzap-style): LookaheadKV's labels, loss, metrics and checkpoints.

Per sample:

1. prefill the prompt under ``no_grad`` (LM head on the last position only), capturing every layer's attention
   input ``(1, layers, S, hidden)`` (:class:`~lkv.core.attention.HiddenCapture`) in the same pass;
2. ground truth s_GT: the label's stored scores, or the response teacher-forced on that cache;
3. the probe's logits ``(layers, kv_heads, S)`` (:class:`~lkv.model.probe.ImportanceProbe`, with grad);
4. loss, by ``target``:

   - ``labels`` (default): mean over (layer, KV head) of KL(s_GT ‖ softmax_S(logits)) — LookaheadKV's ListNet
     loss on the same labels, so the two predictors differ only in what they read: a token's own hidden state
     here, lookahead tokens that see the whole prompt there;
   - ``kvzip``: KVzap's own recipe (kvpress ``kvzap/train.py``): mean squared error between the logits and the
     KVzip+ log-scores of a "repeat the context" pass on the same cache (:mod:`lkv.core.reconstruction`; one
     more forward pass of ~``S`` tokens per step). Keys that got no attention at all (``-inf``) are left out.

Validation compares ``softmax_S(logits)`` with s_GT whatever the target: ``val/kl``, ``val/recall@C``,
``val/kendall_tau`` and SnapKV's reference line, as :class:`~lkv.train.module.LookaheadKVModule` logs them
(:class:`~lkv.train.base.ImportanceModule`). Checkpoints hold the probe's weights only.
"""

from __future__ import annotations

from typing import Literal

import torch

from lkv.core.attention import HiddenCapture
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.probe import ImportanceProbe
from lkv.train.base import ImportanceModule
from lkv.train.datamodule import Sample
from lkv.train.optim import OptimSettings
from lkv.train.probe_head import PROBE_OPTIM, build_probe, check_probe_settings, probe_loss


class ProbeModule(ImportanceModule):
    """Trains a per-layer linear or MLP probe on a frozen LLM's hidden states to predict token importance.

    Args:
        model: base LLM: embedded short name (``smollm2-135m``), local folder, ``.gguf`` file or hub id.
        dtype: weights dtype of the frozen LLM (``float32`` on CPU, ``bfloat16`` on GPU); the probe's: fp32.
        attn_implementation: attention of the frozen LLM: ``sdpa`` or ``eager``.
        hidden_dim: the MLP's hidden width (KVzap: 512); 0 for a linear probe (KVzap's ``linear``).
        target: ``labels`` (KL to s_GT) or ``kvzip`` (MSE to the KVzip+ log-scores, KVzap's recipe).
        optim: AdamW and its schedule (:class:`~lkv.train.optim.OptimSettings`; KVzap: lr 5e-3, cosine).
        eval_budgets: budgets C of the validation Recall@C.
        snapkv_window, snapkv_kernel: SnapKV settings of the reference line (paper: 32, 7, max-pool).
        seed: seed of the probe's initial weights.
    """

    prediction_name = "probe"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        hidden_dim: int = 512,
        target: Literal["labels", "kvzip"] = "labels",
        optim: OptimSettings = PROBE_OPTIM,
        eval_budgets: tuple[int, ...] = (32, 64, 128),
        snapkv_window: int = 32,
        snapkv_kernel: int = 7,
        seed: int = 0,
    ) -> None:
        super().__init__(eval_budgets, optim)
        check_probe_settings(hidden_dim, target, "model.")
        self.save_hyperparameters()
        self.backbone = None
        self.probe: ImportanceProbe | None = None

    def configure_model(self) -> None:
        """Load the frozen LLM, check it against the label folders, and build the probe for its shape."""
        if self.probe is not None:
            return
        hp = self.hparams
        self.backbone = self.load_frozen_backbone(load_backbone)
        self.probe = build_probe(self.backbone, self.signature, hp.hidden_dim, hp.target, hp.seed)

    def train(self, mode: bool = True) -> ProbeModule:
        """Switch the probe's mode; the frozen LLM always stays in eval mode."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def importance(self, sample: Sample, snapkv: bool = False) -> dict[str, torch.Tensor]:
        """Predicted and true importance of one sample from one prefill.

        Returns:
            ``logits`` and ``pred`` (their softmax over ``S``) and ``target`` (s_GT), ``(layers, kv_heads,
            S)``; ``cache``, the prompt's cache; with ``snapkv``, also ``snapkv_window`` (as LookaheadKV's).
        """
        hidden = HiddenCapture()
        prompt, window = self.prefill_sample(self.backbone, sample, snapkv, [hidden])
        logits = self.probe(hidden.stacked(self.backbone.config.num_hidden_layers))[0]
        out = {
            "target": prompt.target,
            "logits": logits,
            "pred": torch.softmax(logits, dim=-1),
            "cache": prompt.cache,
        }
        if window is not None:
            out["snapkv_window"] = window
        return out

    def loss(self, sample: Sample, scores: dict[str, torch.Tensor]) -> torch.Tensor:
        """KL to s_GT (``target: labels``), or the MSE of the logits to the KVzip+ log-scores (``kvzip``):
        :func:`lkv.train.probe_head.probe_loss`."""
        return probe_loss(
            self.hparams.target,
            scores["logits"],
            scores["target"],
            self.backbone,
            self.tokenizer,
            sample["prompt_ids"],
            scores["cache"],
        )

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """State-dict key → parameter of the probe's weights."""
        return {f"probe.{name}": p for name, p in self.probe.named_parameters()}

    def describe(self) -> str:
        hp = self.hparams
        return f"probe ({hp.model}, hidden_dim={hp.hidden_dim}, target={hp.target})"
