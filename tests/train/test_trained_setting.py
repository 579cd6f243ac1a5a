"""The prompt setting a module trains for goes from its labels' meta.json through the fit's checkpoint into the
exported folder's lookahead.json; label folders of both settings are refused."""

import json

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lkv.eviction.presses.lookaheadkv import folder_defaults
from lkv.labels.shards import read_meta
from lkv.model.lookahead import CONFIG_FILE, LookaheadAdapter
from lkv.train.datamodule import LabelDataModule
from lkv.train.export import export_checkpoint, read_checkpoint
from lkv.train.frozen import CHECKPOINT_SETTING
from lkv.train.module import LookaheadKVModule
from tests.conftest import TINY, build_tiny_model, make_label_folder


@pytest.fixture
def folders(tmp_path):
    """Tiny-Llama label folders: ``agnostic`` (4 contexts asked 2 questions each), ``agnostic_val`` (2), ``aware`` (2)."""
    model, tokenizer = build_tiny_model("llama")
    return {
        "agnostic": make_label_folder(model, tokenizer, tmp_path / "agnostic", questions=2),
        "agnostic_val": make_label_folder(
            model, tokenizer, tmp_path / "agnostic_val", num=2, seed=1, questions=2
        ),
        "aware": make_label_folder(model, tokenizer, tmp_path / "aware", num=2),
    }


def fit(tmp_path, train, val) -> LookaheadKVModule:
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)],
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = LookaheadKVModule(model="tiny", **TINY)
    trainer.fit(module, LabelDataModule(train=train, val=val))
    return module


def test_the_setting_goes_from_the_labels_to_the_exported_folder(tiny_backbone, folders, tmp_path):
    assert read_meta(folders["agnostic"]).setting == "agnostic"
    module = fit(tmp_path, str(folders["agnostic"]), str(folders["agnostic_val"]))
    assert module.label_setting == "agnostic"
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert read_checkpoint(ckpt)[CHECKPOINT_SETTING] == "agnostic"
    export_checkpoint(ckpt, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / CONFIG_FILE).read_text())["extra"]["setting"] == "agnostic"
    loaded = LookaheadAdapter.load(tmp_path / "adapter", build_tiny_model("llama")[0])
    assert loaded.config.extra["setting"] == "agnostic"
    assert folder_defaults(tmp_path / "adapter").setting == "agnostic"


def test_aware_labels_and_folders_from_before_the_setting_are_aware(tiny_backbone, folders, tmp_path):
    fit(tmp_path, str(folders["aware"]), None)
    export_checkpoint(tmp_path / "checkpoints" / "last.ckpt", tmp_path / "adapter")
    config = tmp_path / "adapter" / CONFIG_FILE
    assert json.loads(config.read_text())["extra"]["setting"] == "aware"
    raw = json.loads(config.read_text())
    del raw["extra"]["setting"]  # an export from before modules recorded it
    config.write_text(json.dumps(raw))
    assert folder_defaults(tmp_path / "adapter").setting == "aware"
    config.write_text(json.dumps({**raw, "extra": {"setting": "both"}}))
    with pytest.raises(
        ValueError,
        match=r"lookahead.json: extra.setting: expected one of \('aware', 'agnostic'\), found 'both'",
    ):
        folder_defaults(tmp_path / "adapter")


def test_a_fit_on_labels_of_both_settings_is_refused(tiny_backbone, folders, tmp_path):
    message = (
        rf"label folders of both prompt settings \({folders['aware']} is aware, {folders['agnostic']} is "
        r"agnostic; .*fit on aware or on agnostic labels"
    )
    with pytest.raises(ValueError, match=message):
        LabelDataModule(train=[str(folders["aware"]), str(folders["agnostic"])]).label_setting()
    with pytest.raises(ValueError, match="label folders of both prompt settings"):  # a validation folder too
        fit(tmp_path, str(folders["agnostic"]), str(folders["aware"]))
