"""Training callbacks, logged to TensorBoard: an image of predicted vs true vs SnapKV importance, and a
periodic small end-to-end eviction eval (needle prompts compressed by the module being trained).

The budget ablation of validation (Recall@C, Kendall τ over ``eval_budgets`` on the device, with SnapKV's
reference line) is part of :class:`lkv.train.module.LookaheadKVModule` itself, not a callback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib import rc_context
from matplotlib.colors import LogNorm

# pyplot-free figures: no GUI backend is selected and nothing global is left open.
from matplotlib.figure import Figure

from lkv.core.budget import Budget, token_budgets
from lkv.core.tensorboard import figure_summary
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION
from lkv.model.lookahead import LookaheadAdapter

# Colour floor of the heat maps: importance below 1e-5 (of a row summing to 1) shows as the lowest colour.
_FLOOR = 1e-5


def importance_figure(scores: dict[str, torch.Tensor], title: str) -> Figure:
    """Line plot (mean over layers and KV heads) and layer × position heat maps (mean over KV heads), two
    panels a row, 640 px wide at 100 dpi with 10-11 pt text: legible in a TensorBoard image card as it is.

    Args:
        scores: name → ``(layers, kv_heads, S)`` importance, each row summing to 1 (e.g. ``true``,
            ``lookahead``, ``snapkv``).
        title: figure title (the prompt's id, step and split).
    """
    names = list(scores)
    rows = math.ceil((1 + len(names)) / 2)
    with rc_context({"font.size": 10}):
        fig = Figure(figsize=(6.4, 2.9 * rows), dpi=100, layout="constrained")
        line = fig.add_subplot(rows, 2, 1)
        for name in names:
            line.plot(scores[name].float().mean(dim=(0, 1)).cpu().numpy(), label=name, linewidth=0.8)
        line.set_yscale("log")
        line.set_xlabel("prompt position")
        line.set_ylabel("importance (mean)")
        line.legend(loc="upper right", fontsize=8)
        line.set_title("mean over layers, heads")
        maps = {name: s.float().mean(dim=1).clamp_min(_FLOOR).cpu().numpy() for name, s in scores.items()}
        norm = LogNorm(vmin=_FLOOR, vmax=max(m.max() for m in maps.values()))
        axes = []
        for index, name in enumerate(names, 2):
            ax = fig.add_subplot(rows, 2, index)
            image = ax.imshow(maps[name], aspect="auto", interpolation="nearest", norm=norm, cmap="magma")
            ax.set_title(name)
            ax.set_xlabel("prompt position")
            ax.set_ylabel("layer")
            axes.append(ax)
        fig.colorbar(image, ax=axes, shrink=0.8, label="importance (mean over heads)")
        fig.suptitle(title, fontsize=11)
    return fig


class ImportanceImages(L.Callback):
    """After every validation, log :func:`importance_figure` of one fixed validation prompt.

    Reads the scores that the module's ``validation_step`` (:class:`lkv.train.base.ImportanceModule`) returns
    for batch ``batch_index`` (the validation set is not shuffled, so it is the same prompt every time); the
    prediction is named after the module (``lookahead``, ``probe``). It writes them to every
    TensorBoard logger under ``val/importance``, captioned (in the figure and in the card's description)
    with the prompt id, the step and the split. Global rank 0 only; skipped during the sanity check.

    Args:
        batch_index: which validation batch to plot.
    """

    def __init__(self, batch_index: int = 0) -> None:
        self.batch_index = batch_index
        self._scores: dict[str, Any] | None = None

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        if batch_idx == self.batch_index and dataloader_idx == 0 and outputs is not None:
            self._scores = {
                "id": outputs["id"],
                "true": outputs["target"].detach().cpu(),
                pl_module.prediction_name: outputs["pred"].detach().cpu(),
                "snapkv": outputs["snapkv_window"].detach().cpu(),
            }

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        scores, self._scores = self._scores, None
        if scores is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not loggers:
            return
        sample_id = scores.pop("id")
        folder = getattr(trainer.datamodule, "hparams", {}).get("val")
        split = "validation" + (f" ({folder})" if folder else "")
        caption = f"prompt {sample_id} · step {trainer.global_step} · {split}"
        summary = figure_summary("val/importance", importance_figure(scores, caption), caption)
        for logger in loggers:
            logger.experiment.file_writer.add_summary(summary, trainer.global_step)


class NeedleEval(L.Callback):
    """A small end-to-end eviction eval of the module being trained, every ``every_n_steps`` optimiser steps.

    At the end of the first validation at least ``every_n_steps`` steps after the previous run (never in the
    sanity check), the needle prompts of :class:`lkv.eval.tasks.NeedleTask` (held-out essays) are compressed
    with :class:`lkv.eviction.presses.LookaheadKVPress` on the live adapter — real eviction to ``C`` entries per KV
    head, question-aware — and answered through :class:`lkv.eval.runner.Evaluator`. Logged (global rank 0):
    ``val/needle@C`` (string-match accuracy in [0, 1]) per budget and ``val/needle_fullkv`` (no eviction).
    Per-sample rows go to ``<log_dir>/needle/step<N>/results.jsonl``. Between runs it does nothing.

    Cost on the embedded default (2-core CPU, experiments/callback_overhead): 8.8 s per run (2 prompts of
    ~1.1K tokens, FullKV + 2 budgets) against 2.9 s per training step, so the default period of 96 steps (one
    epoch of configs/smollm2_135m.yaml) adds ~3 % to training.

    Args:
        budgets: KV entries kept per head.
        lengths, depths: needle haystack lengths (tokens) and depths; one prompt per (length, depth).
        every_n_steps: optimiser steps between runs.
        max_new_tokens: answer length (a 7-digit number needs ~10 tokens).
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out essay split of the training prompts.
    """

    def __init__(
        self,
        budgets: Sequence[int] = (64, 256),
        lengths: Sequence[int] = (1024,),
        depths: Sequence[float] = (0.25, 0.75),
        every_n_steps: int = 96,
        max_new_tokens: int = 12,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        from lkv.eval.tasks import NeedleTask

        if every_n_steps <= 0:
            raise ValueError(f"NeedleEval: every_n_steps must be positive, got {every_n_steps}")
        self.budgets = list(token_budgets(budgets, "NeedleEval.budgets"))
        self.every_n_steps = every_n_steps
        self.task = NeedleTask(
            lengths=tuple(lengths),
            depths=tuple(depths),
            max_new_tokens=max_new_tokens,
            essays_dir=essays_dir,
            heldout_fraction=heldout_fraction,
        )
        self._next_step = every_n_steps

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.global_step < self._next_step:
            return
        self._next_step = trainer.global_step + self.every_n_steps
        if not trainer.is_global_zero:
            return
        from lkv.eval.results import budget_key
        from lkv.eval.runner import Evaluator
        from lkv.eviction.presses import FullKVPress, LookaheadKVPress

        press = LookaheadKVPress(pl_module.adapter)
        output = Path(trainer.log_dir or trainer.default_root_dir) / "needle" / f"step{trainer.global_step}"
        evaluator = Evaluator(
            press.base_model,
            pl_module.tokenizer,
            {"fullkv": FullKVPress(), "lookaheadkv": press},
            self.budgets,
            ["aware"],
            output,
            progress=False,
        )
        rows = evaluator.run([self.task])
        for method, budget in [("fullkv", None), *(("lookaheadkv", b) for b in self.budgets)]:
            key = budget_key(None if budget is None else Budget(budget))
            scores = [r["score"] for r in rows if r["method"] == method and r["budget"] == key]
            name = "val/needle_fullkv" if budget is None else f"val/needle@{budget}"
            pl_module.log(name, sum(scores) / len(scores), rank_zero_only=True)

    def state_dict(self) -> dict[str, Any]:
        return {"next_step": self._next_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._next_step = state_dict["next_step"]


@runtime_checkable
class SiblingModules(Protocol):
    """A callback that trains more lookahead modules in the same fit (:class:`lkv.sweep.ablation.LookaheadAblation`):
    :class:`NeedleReach` evaluates each of them beside the module being trained."""

    def siblings(self) -> dict[str, tuple[LookaheadAdapter, str]]:
        """Sibling name (its method name in result rows) → (its module, the prefix of its logged metrics)."""
        ...


class NeedleReach(L.Callback):
    """Needle-token retention of the module being trained (and of its ablation siblings) at every validation.

    Runs :class:`lkv.eval.tasks.NeedleTokenTask` on ``needles`` — prefill only, no answer decoded but the
    Oracle's — with the live adapter as ``lookaheadkv``, each sibling of a :class:`SiblingModules` callback
    in the same fit under its point name, and the Oracle. Logged (global rank 0), per budget ``C``:
    ``val/needle_kept@C`` (the share of the value's tokens kept, mean over samples and (layer, KV head)),
    ``ablation/<point>/val/needle_kept@C`` for siblings and ``val/oracle_needle_kept@C``. Rows go to
    ``<log_dir>/reach/step<N>/results.jsonl``. Point it at long prompts with the needle far from the end (the
    reach the training prompts do not show) and at a seed the evaluation does not use.

    Args:
        needles: the needle samples, e.g. ``NeedleFamilyTask(lengths=[4096], distances=[2000, 3000], seed=1)``.
        budgets: KV entries kept per head.
    """

    def __init__(self, needles: Any, budgets: Sequence[int] = (64, 128, 256)) -> None:
        from lkv.eval.tasks import NeedleFamilyTask, NeedleTokenTask

        if not isinstance(needles, NeedleFamilyTask):
            raise TypeError(f"NeedleReach.needles: expected a NeedleFamilyTask, got {type(needles).__name__}")
        self.task = NeedleTokenTask(needles)
        self.budgets = list(token_budgets(budgets, "NeedleReach.budgets"))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        from lkv.eval.runner import Evaluator
        from lkv.eviction.presses import LookaheadKVPress, OraclePress

        presses = {"lookaheadkv": LookaheadKVPress(pl_module.adapter), "oracle": OraclePress()}
        names = {"lookaheadkv": "val", "oracle": "val/oracle"}
        for callback in trainer.callbacks:
            if isinstance(callback, SiblingModules):
                for name, (adapter, prefix) in callback.siblings().items():
                    presses[name] = LookaheadKVPress(adapter)
                    names[name] = prefix
        output = Path(trainer.log_dir or trainer.default_root_dir) / "reach" / f"step{trainer.global_step}"
        model = presses["lookaheadkv"].base_model
        evaluator = Evaluator(model, pl_module.tokenizer, presses, self.budgets, ["aware"], output, False)
        with torch.no_grad():
            rows = evaluator.run([self.task])
        for method, prefix in names.items():
            for budget in self.budgets:
                scores = [r["score"] for r in rows if r["method"] == method and r["budget"] == str(budget)]
                name = (
                    f"{prefix}/needle_kept@{budget}"
                    if method != "oracle"
                    else f"{prefix}_needle_kept@{budget}"
                )
                pl_module.log(name, sum(scores) / len(scores), rank_zero_only=True)
