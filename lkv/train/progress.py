"""`lkv fit` progress as lines when output is not a terminal (a log file, a pipe).

Lightning's progress bar redraws a terminal line; written to a file it is a growing line of carriage
returns that shows nothing readable until the loop ends. :func:`bar_on_terminal_only` switches it off there
(it stays the trainer's progress bar, so the lines below know progress is wanted), and
:class:`FitProgressLines` prints a line every ~5 % of the optimiser steps (step, epoch, loss, time left) and
one per validation (its ``val/*`` metrics). :func:`lkv.train.cli.lightning_main` adds it to every fit.
"""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.callbacks import ProgressBar

from lkv.core.progress import Progress, interactive


def bar_on_terminal_only(trainer: L.Trainer) -> None:
    """Silence ``trainer``'s progress bar (tqdm's or rich's) when standard output is no terminal (lkv prints progress
    lines there instead: :class:`FitProgressLines`, the labeller's :class:`~lkv.core.progress.Progress`)."""
    bar = trainer.progress_bar_callback
    if isinstance(bar, ProgressBar) and not interactive():
        bar.disable()


class FitProgressLines(L.Callback):
    """Lines of a fit's progress, on global rank 0, when the progress bar is on and output is no terminal."""

    def __init__(self) -> None:
        self.progress: Progress | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = trainer.estimated_stepping_batches  # optimiser steps of the whole fit; inf when unbounded
        self.progress = Progress(
            "lkv fit",
            int(total) if math.isfinite(total) else 0,
            "steps",
            enabled=trainer.is_global_zero
            and trainer.progress_bar_callback is not None
            and math.isfinite(total),
            bar=False,
            start=trainer.global_step,  # a resumed fit
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        loss = trainer.callback_metrics.get("train/loss")
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        note = f"epoch {trainer.current_epoch + 1}{epochs}"
        if loss is not None:
            note += f", train/loss {float(loss):.4f}"
        self.progress.advance_to(trainer.global_step, note)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.progress is None or not self.progress.lines or trainer.sanity_checking:
            return
        metrics = sorted((k, float(v)) for k, v in trainer.callback_metrics.items() if k.startswith("val/"))
        shown = ", ".join(f"{name} {value:.4f}" for name, value in metrics)
        print(f"lkv fit: validation at step {trainer.global_step}: {shown}", flush=True)
