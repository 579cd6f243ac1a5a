"""A ModelCheckpoint that saves every N training steps while monitoring a validation metric saves nothing before
the first validation (Lightning defers those saves), so `lkv fit` warns about it; the fix the warning names, a
second checkpoint with no monitor, saves from the first step."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lkv.train.cli import deferred_step_saves


class ValidatedModel(BoringModel):
    """BoringModel that logs ``val/loss`` on validation."""

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("val/loss", loss)
        return loss


class Crash(L.Callback):
    """Ends the fit like a killed process after training batch 3: nothing runs after it."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 2:
            raise SystemExit("killed")


def fit_until_killed(callback: ModelCheckpoint, root: Path) -> None:
    """Three training steps of a 64-batch epoch, then the process dies: no validation has run."""
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        callbacks=[callback, Crash()],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    with pytest.raises(SystemExit):
        trainer.fit(ValidatedModel())


def test_a_monitored_step_checkpoint_keeps_nothing_before_the_first_validation(tmp_path):
    monitored = ModelCheckpoint(
        dirpath=tmp_path / "monitored", monitor="val/loss", save_last=True, every_n_train_steps=1
    )
    fit_until_killed(monitored, tmp_path)
    assert not list((tmp_path / "monitored").glob("*.ckpt"))  # the premise of the warning
    plain = ModelCheckpoint(dirpath=tmp_path / "plain", save_last=True, save_top_k=0, every_n_train_steps=1)
    fit_until_killed(plain, tmp_path)
    assert [p.name for p in (tmp_path / "plain").glob("*.ckpt")] == ["last.ckpt"]  # the fix it names


def test_only_a_monitored_step_checkpoint_is_warned_about(tmp_path):
    monitored = ModelCheckpoint(
        dirpath=tmp_path / "a", monitor="val/kl", save_last=True, every_n_train_steps=32
    )
    callbacks = [
        monitored,
        ModelCheckpoint(dirpath=tmp_path / "b", save_last=True, save_top_k=0, every_n_train_steps=32),
        ModelCheckpoint(dirpath=tmp_path / "c", monitor="val/kl", save_last=True),  # saves at validation only
    ]
    (warning,) = deferred_step_saves(callbacks)
    assert warning.startswith(f"ModelCheckpoint {tmp_path / 'a'}: it saves every 32 training steps")
    assert "monitors 'val/kl'" in warning and "no monitor" in warning
