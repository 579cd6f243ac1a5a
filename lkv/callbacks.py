"""Training callbacks: an image of predicted vs true vs SnapKV importance, logged to TensorBoard."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.colors import LogNorm

# pyplot-free figures: no GUI backend is selected and nothing global is left open.
from matplotlib.figure import Figure

# Colour floor of the heat maps: importance below 1e-5 (of a row summing to 1) shows as the lowest colour.
_FLOOR = 1e-5


def importance_figure(scores: dict[str, torch.Tensor], title: str) -> Figure:
    """Line plot (mean over layers and KV heads) and layer × position heat maps (mean over KV heads).

    Args:
        scores: name → ``(layers, kv_heads, S)`` importance, each row summing to 1 (e.g. ``true``,
            ``lookahead``, ``snapkv``).
        title: figure title (the prompt's id).
    """
    names = list(scores)
    fig = Figure(figsize=(4 * len(names), 7), layout="constrained")
    grid = fig.add_gridspec(2, len(names), height_ratios=[1, 1.3])
    line = fig.add_subplot(grid[0, :])
    for name in names:
        line.plot(scores[name].float().mean(dim=(0, 1)).cpu().numpy(), label=name, linewidth=0.8)
    line.set_yscale("log")
    line.set_xlabel("prompt position")
    line.set_ylabel("importance (mean over layers, heads)")
    line.legend(loc="upper right")
    line.set_title(title)
    maps = {name: s.float().mean(dim=1).clamp_min(_FLOOR).cpu().numpy() for name, s in scores.items()}
    norm = LogNorm(vmin=_FLOOR, vmax=max(m.max() for m in maps.values()))
    for col, name in enumerate(names):
        ax = fig.add_subplot(grid[1, col])
        image = ax.imshow(maps[name], aspect="auto", interpolation="nearest", norm=norm, cmap="magma")
        ax.set_title(name)
        ax.set_xlabel("prompt position")
        ax.set_ylabel("layer")
    fig.colorbar(image, ax=fig.axes[1:], shrink=0.8, label="importance (mean over heads)")
    return fig


class ImportanceImages(L.Callback):
    """After every validation, log :func:`importance_figure` of one fixed validation prompt.

    Reads the scores that :meth:`LookaheadKVModule.validation_step` returns for batch ``batch_index``
    (the validation set is not shuffled, so it is the same prompt every time) and writes them to every
    TensorBoard logger under ``val/importance``. Global rank 0 only; skipped during the sanity check.

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
                "lookahead": outputs["pred"].detach().cpu(),
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
        fig = importance_figure(scores, f"{sample_id} (step {trainer.global_step})")
        for logger in loggers:
            logger.experiment.add_figure("val/importance", fig, global_step=trainer.global_step, close=False)
