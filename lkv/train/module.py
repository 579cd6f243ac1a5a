"""The LookaheadKV LightningModule: frozen LLM + lookahead module, two-phase training step, ranking metrics.

Per sample (docs/design.md §1, "Two-phase training step"):

1. prefill the prompt with the adapter off under ``no_grad`` (LM head on the last position only);
2. ground truth: the label's stored scores, or — for a responses-only label folder — the response
   teacher-forced on that same cache (:func:`lkv.labels.labeller.response_importance`, crops back);
3. :meth:`LookaheadAdapter.predict`: the ``M`` lookahead tokens with the adapter on and grad;
4. loss = mean over (layer, KV head) of KL(s_GT ‖ s_LKV); backward runs through the ``M`` tokens only.

Validation adds SnapKV's scores from an observation-window capture taken during the same prefill, and
logs ``val/kl``, ``val/recall@C``, ``val/kendall_tau``, ``val/snapkv_recall@C``, ``val/snapkv_kendall_tau``.
A fit names the first three as the metrics of its TensorBoard HParams session, so the HParams tab ranks runs
by their last validation values. Checkpoints hold only the trainable weights (and optimiser state); the
frozen LLM is reloaded by :meth:`configure_model`. All of this is shared with the per-token probe
(:mod:`lkv.train.probe_module`) through :class:`lkv.train.base.ImportanceModule`.

With :attr:`LookaheadKVModule.share_prefill` set (by :class:`lkv.train.ablation.LookaheadAblation`), the
training and validation steps also return every sample's prefill as a :class:`~lkv.train.base.SharedPrefill`
(``outputs["prefills"]``), so other lookahead modules can run their own steps on it without prefilling again.
"""

from __future__ import annotations

from typing import Literal

import torch

from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.lookahead import LookaheadAdapter
from lkv.train.base import ImportanceModule
from lkv.train.datamodule import Sample


class LookaheadKVModule(ImportanceModule):
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
        seed: seed of the embedding and LoRA initialisation.
    """

    prediction_name = "lookahead"

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
    ) -> None:
        super().__init__(eval_budgets)
        self.save_hyperparameters()
        self.adapter: LookaheadAdapter | None = None

    def configure_model(self) -> None:
        """Load the frozen LLM, check it against the label folders, and attach the lookahead module."""
        if self.adapter is not None:
            return
        hp = self.hparams
        backbone = self.load_frozen_backbone(load_backbone)
        self.adapter = LookaheadAdapter.create(
            backbone,
            num_tokens=hp.num_lookahead,
            lora_rank=hp.lora_rank,
            lora_alpha=hp.lora_alpha,
            lora_dropout=hp.lora_dropout,
            target_modules=hp.lora_targets,
            init=hp.lookahead_init,
            seed=hp.seed,
        )
        self.adapter.config.base_model = self.signature.to_dict()

    def importance(self, sample: Sample, snapkv: bool = False) -> dict[str, torch.Tensor]:
        """Predicted and true importance of one sample, sharing one prefill (adapter off).

        Returns:
            ``pred`` and ``target`` ``(layers, kv_heads, S)``; ``cache``, the prompt's cache (cropped back);
            with ``snapkv``, also ``snapkv_window``, the normalised attention of the last ``snapkv_window``
            prompt queries ``(layers, kv_heads, S)``.
        """
        prompt, window = self.prefill_sample(self.adapter.model, sample, snapkv)
        pred = self.adapter.predict(prompt.cache, prompt.prompt_len)[0]
        out = {"target": prompt.target, "pred": pred, "cache": prompt.cache}
        if window is not None:
            out["snapkv_window"] = window
        return out

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """State-dict key → parameter of the lookahead embeddings and the LoRA weights."""
        return {f"adapter.{name}": p for name, p in self.adapter.trainable_parameters().items()}

    def describe(self) -> str:
        return f"lookahead module ({self.hparams.model}, lora_targets={self.hparams.lora_targets})"
