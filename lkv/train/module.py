"""The LookaheadKV LightningModule: frozen LLM + lookahead module, two-phase training step, ranking metrics.

Per sample (docs/design.md §1, "Two-phase training step"):

1. prefill the prompt with the adapter off under ``no_grad`` (LM head on the last position only);
2. ground truth: the label's stored scores, or — for a responses-only label folder — the response
   teacher-forced on that same cache (:func:`lkv.labels.labeller.response_importance`, crops back);
3. :meth:`LookaheadAdapter.predict`: the ``M`` lookahead tokens with the adapter on and grad;
4. loss = mean over (layer, KV head) of KL(s_GT ‖ s_LKV) (plus an optional top-``C`` term:
   :func:`training_loss`); backward runs through the ``M`` tokens only.

Two training-only augmentations aim at prompts longer than the training ones (experiments/reach): a position
offset of the lookahead tokens and a position gap inside the prompt (``max_position_offset``,
``max_position_gap``); both are off by default.

Validation adds SnapKV's scores from an observation-window capture taken during the same prefill, and
logs ``val/kl``, ``val/recall@C``, ``val/kendall_tau``, ``val/snapkv_recall@C``, ``val/snapkv_kendall_tau``.
A fit names the first three as the metrics of its TensorBoard HParams session, so the HParams tab ranks runs
by their last validation values. Checkpoints hold only the trainable weights (and optimiser state); the
frozen LLM is reloaded by :meth:`configure_model`. All of this is shared with the per-token probe
(:mod:`lkv.train.probe_module`) through :class:`lkv.train.base.ImportanceModule`.

With :attr:`LookaheadKVModule.share_prefill` set (by :class:`lkv.sweep.ablation.LookaheadAblation`), the
training and validation steps also return every sample's prefill as a :class:`~lkv.train.base.SharedPrefill`
(``outputs["prefills"]``), so other lookahead modules can run their own steps on it without prefilling again.

With ``probe`` set (:class:`~lkv.train.probe_head.ProbeSettings`), a per-token probe (KVzap-style, as
:class:`~lkv.train.probe_module.ProbeModule` trains it alone) trains beside the lookahead module on the same
prefill: the prefill also captures every layer's attention input (:class:`~lkv.core.attention.HiddenCapture`),
the probe's loss on the same s_GT is logged as ``train/probe_loss`` and added to the backpropagated loss (the
two share no parameter, so the lookahead module's gradients are those of a fit without the probe), the probe has
its own AdamW parameter group (``probe.optim``: KVzap's lr 5e-3 beside the module's), and validation logs its
``val/probe/kl``, ``val/probe/recall@C``, ``val/probe/kendall_tau`` beside the module's. Checkpoints hold both
predictors' weights; ``lkv export`` writes the probe to ``<folder>/probe`` (:mod:`lkv.train.export`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torchmetrics import MetricCollection

from lkv.core.attention import HiddenCapture
from lkv.core.metrics import importance_loss, ranking_metrics
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.lookahead import LookaheadAdapter
from lkv.train.base import ImportanceModule
from lkv.train.copy_target import copied_positions, copy_boosted
from lkv.train.datamodule import Sample
from lkv.train.optim import OptimSettings, ParamGroup, as_settings
from lkv.train.probe_head import ProbeSettings, build_probe, probe_loss

# the paper's AdamW: lr 1e-3, betas (0.9, 0.95), cosine
LOOKAHEAD_OPTIM = OptimSettings()


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


def training_loss(
    target: torch.Tensor, pred: torch.Tensor, hparams: Mapping[str, Any], sample: Sample
) -> torch.Tensor:
    """Per-row training loss ``(layers, kv_heads, S) → (layers, kv_heads)`` of a module's hyper-parameters on
    ``sample`` (the KL to s_GT, copy-boosted when ``copy_boost`` > 0, plus the top-``C`` term when
    ``topc_loss_weight`` > 0); sibling modules of an in-run ablation use it with their own."""
    if hparams["copy_boost"] > 0:
        copied = copied_positions(sample["prompt_ids"], sample["response_ids"])
        target = copy_boosted(target, copied, hparams["copy_boost"])
    return importance_loss(target, pred, hparams["topc_loss_weight"], hparams["topc_loss_budget"])


class LookaheadKVModule(ImportanceModule):
    """Trains ``M`` lookahead embeddings and a LoRA adapter to predict a frozen LLM's future attention.

    Args:
        model: base LLM: embedded short name (``smollm2-135m``), local folder, ``.gguf`` file or hub id.
        dtype: weights dtype of the frozen LLM (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: attention of the frozen LLM: ``sdpa`` or ``eager`` (``flex_attention`` is refused).
        num_lookahead: ``M``, lookahead embeddings (paper: 32).
        lookahead_init: ``vocab_mean``, ``random_tokens`` or ``normal`` (see :func:`lkv.model.tokens.init_embeddings`).
        lora_rank, lora_alpha, lora_dropout: LoRA settings (paper: 8, 32, 0).
        lora_targets: ``all-linear`` (q,k,v,o,gate,up,down), a list of module names, or ``none`` to train
            the embeddings alone.
        optim: AdamW and its learning-rate schedule (:class:`~lkv.train.optim.OptimSettings`).
        eval_budgets: budgets C of the validation Recall@C.
        snapkv_window, snapkv_kernel: SnapKV settings of the reference line (paper: 32, 7, max-pool).
        seed: seed of the embedding and LoRA initialisation (and of the position offsets and gaps).
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
        copy_boost: share of each (layer, KV head) row of the training target moved, equally per token, onto the
            prompt tokens the response copies (:mod:`lkv.train.copy_target`), so every head learns to keep a
            copied value and not only the key phrase before it; 0 = s_GT as labelled. Validation metrics
            always score against s_GT itself.
        probe: a per-token probe to train beside the module on the same prefill
            (:class:`~lkv.train.probe_head.ProbeSettings`); ``None`` (default): the module alone.
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
        optim: OptimSettings = LOOKAHEAD_OPTIM,
        eval_budgets: tuple[int, ...] = (32, 64, 128),
        snapkv_window: int = 32,
        snapkv_kernel: int = 7,
        seed: int = 0,
        max_position_offset: int = 0,
        max_position_gap: int = 0,
        topc_loss_weight: float = 0.0,
        topc_loss_budget: int = 64,
        copy_boost: float = 0.0,
        probe: ProbeSettings | None = None,
    ) -> None:
        super().__init__(eval_budgets, optim)
        # as a dataclass here: the hyper-parameters keep what LightningCLI parsed (a dict)
        self.probe_settings = None if probe is None else as_settings(probe, ProbeSettings, "model.probe")
        if topc_loss_weight < 0 or topc_loss_budget <= 0:
            raise ValueError(
                f"model.topc_loss_weight must be ≥ 0 and model.topc_loss_budget positive, found "
                f"{topc_loss_weight} and {topc_loss_budget}"
            )
        if not 0 <= copy_boost < 1:
            raise ValueError(f"model.copy_boost: expected a share in [0, 1), found {copy_boost}")
        if max_position_offset < 0 or max_position_gap < 0:
            raise ValueError(
                f"model.max_position_offset and model.max_position_gap: expected ≥ 0 positions, found "
                f"{max_position_offset} and {max_position_gap}"
            )
        self.save_hyperparameters()
        self.adapter: LookaheadAdapter | None = None
        self.probe = None
        if probe is not None:
            budgets = list(eval_budgets)
            self.val_probe = ranking_metrics(budgets, "val/probe/")
            self.test_probe = ranking_metrics(budgets, "test/probe/")

    def configure_model(self) -> None:
        """Load the frozen LLM, check it against the label folders, and attach the lookahead module."""
        if self.adapter is not None:
            return
        hp = self.hparams
        backbone = self.load_frozen_backbone(load_backbone)
        self.adapter = LookaheadAdapter.create(backbone, **adapter_settings(hp))
        self.adapter.config.base_model = self.signature.to_dict()
        if self.probe_settings is not None:
            settings = self.probe_settings
            self.probe = build_probe(
                self.adapter.base_model, self.signature, settings.hidden_dim, settings.target, settings.seed
            )

    def importance(
        self, sample: Sample, snapkv: bool = False, position_offset: int = 0, gap: tuple[int, int] = (0, 0)
    ) -> dict[str, torch.Tensor]:
        """Predicted and true importance of one sample, sharing one prefill (adapter off).

        Args:
            position_offset: the lookahead tokens' position offset (:meth:`LookaheadAdapter.predict`).
            gap: ``(cut, g)``: prompt positions from ``cut`` on, and the lookahead tokens, move ``g`` further
                (``max_position_gap``); ``(0, 0)``: none.

        Returns:
            ``pred`` and ``target`` ``(layers, kv_heads, S)``; ``cache``, the prompt's cache (cropped back);
            ``position_offset``, the gap ``g``; with ``snapkv``, also ``snapkv_window``, the normalised
            attention of the last ``snapkv_window`` prompt queries ``(layers, kv_heads, S)``; with a probe,
            also ``probe_logits`` and ``probe_pred`` (their softmax over ``S``), ``(layers, kv_heads, S)``,
            from the attention inputs of the same prefill.
        """
        hidden = [HiddenCapture()] if self.probe is not None else []
        prompt, window = self.prefill_sample(self.adapter.model, sample, snapkv, hidden, gap=gap)
        pred = self.adapter.predict(
            prompt.cache, prompt.prompt_len, position_offset + prompt.position_offset
        )[0]
        out = {
            "target": prompt.target,
            "pred": pred,
            "cache": prompt.cache,
            "position_offset": prompt.position_offset,
        }
        if window is not None:
            out["snapkv_window"] = window
        if hidden:
            logits = self.probe(hidden[0].stacked(self.adapter.base_model.config.num_hidden_layers))[0]
            out["probe_logits"], out["probe_pred"] = logits, torch.softmax(logits, dim=-1)
        return out

    def training_importance(self, sample: Sample, batch_idx: int, index: int) -> dict[str, torch.Tensor]:
        """:meth:`importance` with this sample's position offset and gap (deterministic draws)."""
        hp = self.hparams
        offset = draw_position_offset(hp.max_position_offset, hp.seed, self.current_epoch, batch_idx, index)
        gap = draw_position_gap(
            hp.max_position_gap, hp.seed, self.current_epoch, batch_idx, index, len(sample["prompt_ids"])
        )
        return self.importance(sample, position_offset=offset, gap=gap)

    def loss(self, sample: Sample, scores: dict[str, torch.Tensor]) -> torch.Tensor:
        """One sample's training loss: :func:`training_loss` (the KL, plus the top-``C`` term when weighted)."""
        return training_loss(scores["target"], scores["pred"], self.hparams, sample).mean()

    def side_losses(self, sample: Sample, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """With a probe, ``probe_loss``: its loss on the same sample (:func:`lkv.train.probe_head.probe_loss`)."""
        if self.probe is None:
            return {}
        loss = probe_loss(
            self.probe_settings.target,
            scores["probe_logits"],
            scores["target"],
            self.adapter.base_model,
            self.tokenizer,
            sample["prompt_ids"],
            scores["cache"],
        )
        return {"probe_loss": loss}

    def side_metrics(self, stage: str) -> dict[str, MetricCollection]:
        """With a probe, its ``val/probe/...`` (or ``test/probe/...``) ranking metrics."""
        return {} if self.probe is None else {"probe_pred": getattr(self, f"{stage}_probe")}

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        """State-dict key → parameter of the lookahead embeddings and the LoRA weights (and the probe's)."""
        params = {f"adapter.{name}": p for name, p in self.adapter.trainable_parameters().items()}
        if self.probe is not None:
            params |= {f"probe.{name}": p for name, p in self.probe.named_parameters()}
        return params

    def param_groups(self) -> list[ParamGroup]:
        """The module's weights with ``optim``; with a probe, its weights in a group of their own with
        ``probe.optim`` (one AdamW: Lightning's automatic optimisation steps one optimiser)."""
        module = list(self.adapter.trainable_parameters().values())
        groups = [ParamGroup("module", module, self.optim)]
        if self.probe is not None:
            groups.append(ParamGroup("probe", list(self.probe.parameters()), self.probe_settings.optim))
        return groups

    def describe(self) -> str:
        probe = "" if self.probe is None else f", probe hidden_dim={self.probe_settings.hidden_dim}"
        return f"lookahead module ({self.hparams.model}, lora_targets={self.hparams.lora_targets}{probe})"
