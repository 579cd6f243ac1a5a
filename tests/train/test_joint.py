"""A lookahead module and a per-token probe trained in one fit on the same prefill (``model.probe``): each
trains as it would alone, one checkpoint holds and resumes both, one `lkv export` folder holds both."""

import copy
import json
import re

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

import lkv.train.probe_module
from lkv.cli import main as lkv_main
from lkv.model.backbone import load_backbone
from lkv.model.lookahead import CONFIG_FILE, LookaheadAdapter
from lkv.model.probe import PROBE_CONFIG_FILE, PROBE_SUBFOLDER, PROBE_WEIGHTS_FILE, ImportanceProbe
from lkv.train.datamodule import LabelDataModule
from lkv.train.export import export_checkpoint, load_checkpoint
from lkv.train.module import LookaheadKVModule
from lkv.train.optim import OptimSettings
from lkv.train.probe_head import ProbeSettings
from lkv.train.probe_module import ProbeModule
from tests.cli.conftest import fit_settings, make_workspace
from tests.conftest import TINY, TINY_EVAL, build_tiny_model

# the probe's own settings: another lr than the module's (TINY: 1e-2), a warm-up the module does not have
PROBE_OPTIM = OptimSettings(lr=3e-2, warmup_steps=2, min_lr_ratio=0.2)
PROBE = ProbeSettings(hidden_dim=8, seed=3, optim=PROBE_OPTIM)


@pytest.fixture
def tiny_probe_backbone(tiny_backbone, monkeypatch):
    """Both LightningModules load the tiny Llama (same weights every call)."""
    monkeypatch.setattr(
        lkv.train.probe_module, "load_backbone", lambda model, **kw: build_tiny_model("llama")
    )


class Record(L.Callback):
    """The trainable weights and the optimiser state at the start of training."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights = {k: p.detach().clone() for k, p in pl_module.trainable_parameters().items()}
        self.optimizer = copy.deepcopy(trainer.optimizers[0].state_dict())
        self.schedule = trainer.lr_scheduler_configs[0].scheduler.state_dict()


def run(module, folders, root, max_steps: int, ckpt_path: str | None = None):
    """``max_steps`` of ``module`` on the tiny labels (seed 0), validation at the end; gradients clipped to a
    norm small enough that every step clips them."""
    L.seed_everything(0)
    record = Record()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=root / "checkpoints", save_last=True), record],
        gradient_clip_val=1e-3,
        val_check_interval=max_steps,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = LabelDataModule(train=str(folders["train"]), val=str(folders["val"]))
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer, record


def joint(**settings) -> LookaheadKVModule:
    return LookaheadKVModule(model="tiny", **TINY, **settings, probe=PROBE)


def test_the_joint_fit_trains_each_predictor_as_it_trains_alone(tiny_probe_backbone, label_folders, tmp_path):
    # LoRA dropout draws from the global random stream: building the probe must leave it as it was
    both, _ = run(joint(lora_dropout=0.2), label_folders, tmp_path / "joint", 5)
    alone, _ = run(
        LookaheadKVModule(model="tiny", **TINY, lora_dropout=0.2), label_folders, tmp_path / "module", 5
    )
    probe_fit, _ = run(
        ProbeModule(model="tiny", hidden_dim=8, seed=3, optim=PROBE_OPTIM, **TINY_EVAL),
        label_folders,
        tmp_path / "probe",
        5,
    )
    module, probe = both.lightning_module, probe_fit.lightning_module
    # the lookahead module: bit for bit (its loss, gradients, clipping and AdamW group are its own)
    got, want = module.adapter.trainable_parameters(), alone.lightning_module.adapter.trainable_parameters()
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], atol=0, rtol=0, msg=name)
    # the probe: bit for bit a probe fit's too. Its attention inputs come from the module's prefill, the peft
    # model with its adapter off, whose LoRA layers then run their base layers alone: the bare model's values
    trained = dict(module.probe.named_parameters())
    initial = ImportanceProbe.create(build_tiny_model("llama")[0], 8, seed=3).state_dict()
    for name, param in probe.probe.named_parameters():
        torch.testing.assert_close(trained[name], param, atol=0, rtol=0, msg=name)
        assert not torch.equal(param, initial[name])  # it trained
    # its own schedule: the probe group's lr after 5 steps is its own, not the module's
    lrs = {group["name"]: group["lr"] for group in both.optimizers[0].param_groups}
    assert lrs == {
        "module": alone.optimizers[0].param_groups[0]["lr"],
        "probe": probe_fit.optimizers[0].param_groups[0]["lr"],
    }
    # logged: the probe's loss and its validation metrics beside the module's
    metrics = both.callback_metrics
    assert {"train/loss", "train/probe_loss", "val/recall@4", "val/probe/recall@4", "val/probe/kl"} <= set(
        metrics
    )
    torch.testing.assert_close(metrics["val/recall@8"], alone.callback_metrics["val/recall@8"])
    torch.testing.assert_close(metrics["val/probe/kl"], probe_fit.callback_metrics["val/kl"], atol=0, rtol=0)


def test_resume_restores_both_predictors_and_their_optimiser_groups(
    tiny_probe_backbone, label_folders, tmp_path
):
    trainer, _ = run(joint(), label_folders, tmp_path, 3)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    module = trainer.lightning_module
    assert set(checkpoint["state_dict"]) == set(module.trainable_parameters())
    assert any(k.startswith("probe.") for k in checkpoint["state_dict"])
    (saved,) = checkpoint["optimizer_states"]
    resumed, record = run(joint(), label_folders, tmp_path, 5, ckpt_path="last")
    assert resumed.global_step == 5
    for name, weight in checkpoint["state_dict"].items():
        torch.testing.assert_close(record.weights[name], weight, atol=0, rtol=0, msg=name)
    # both parameter groups: their AdamW moments, step counts and settings, and the schedule's position
    assert [g["name"] for g in record.optimizer["param_groups"]] == ["module", "probe"]
    assert [g["lr"] for g in record.optimizer["param_groups"]] == [g["lr"] for g in saved["param_groups"]]
    assert record.optimizer["state"].keys() == saved["state"].keys() and len(saved["state"]) == sum(
        len(g["params"]) for g in saved["param_groups"]
    )
    for index, state in saved["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(record.optimizer["state"][index][key], value, atol=0, rtol=0)
    assert record.schedule["last_epoch"] == checkpoint["lr_schedulers"][0]["last_epoch"] == 3


def test_export_writes_the_module_folder_with_the_probe_inside(tiny_probe_backbone, label_folders, tmp_path):
    trainer, _ = run(joint(), label_folders, tmp_path, 2)
    module = trainer.lightning_module
    out = tmp_path / "export"
    message = export_checkpoint(tmp_path / "checkpoints" / "last.ckpt", out)
    assert f"with its probe in {out / PROBE_SUBFOLDER} (preset long)" in message
    assert {PROBE_CONFIG_FILE, PROBE_WEIGHTS_FILE} == {p.name for p in (out / PROBE_SUBFOLDER).iterdir()}
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["extra"] == {"model": "tiny", "preset": "long", "setting": "aware"}
    base, _ = build_tiny_model("llama")
    adapter = LookaheadAdapter.load(out, base)
    probe = ImportanceProbe.load(out / PROBE_SUBFOLDER, base)
    assert probe.config.extra == {"model": "tiny"} and probe.config.hidden_dim == 8
    for name, param in module.probe.named_parameters():
        torch.testing.assert_close(dict(probe.named_parameters())[name], param.detach(), atol=0, rtol=0)
    torch.testing.assert_close(adapter.embeddings, module.adapter.embeddings.detach(), atol=0, rtol=0)


def test_a_module_checkpoint_without_a_probe_exports_as_before(tiny_probe_backbone, label_folders, tmp_path):
    run(LookaheadKVModule(model="tiny", **TINY), label_folders, tmp_path, 1)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    # a checkpoint written before `model.optim`: the optimiser settings as flat hyper-parameters
    old = torch.load(ckpt, map_location="cpu", weights_only=False)
    hparams = old["hyper_parameters"]
    hparams |= {
        "lr": 1e-2,
        "betas": (0.9, 0.95),
        "weight_decay": 0.0,
        "warmup_steps": 0,
        "scheduler": "cosine",
    }
    del hparams["optim"], hparams["probe"]
    del old["label_setting"]  # and from before checkpoints kept their labels' setting: aware
    torch.save(old, tmp_path / "old.ckpt")
    for path in (ckpt, tmp_path / "old.ckpt"):
        assert isinstance(load_checkpoint(path), LookaheadKVModule)
        export_checkpoint(path, tmp_path / path.stem)
        assert not (tmp_path / path.stem / PROBE_SUBFOLDER).exists()
        assert json.loads((tmp_path / path.stem / CONFIG_FILE).read_text())["extra"] == {
            "model": "tiny",
            "setting": "aware",
        }


def test_lkv_fit_resume_and_export_of_a_joint_config(tmp_path, capsys):
    """Through the real entry points: the probe settings as a config section, a resumed fit, one export folder."""
    root = make_workspace(tmp_path)
    run = tmp_path / "run"
    settings = fit_settings(root, run, max_steps=2)
    settings["model"]["probe"] = {"hidden_dim": 8, "optim": {"lr": 2e-2, "warmup_steps": 1}}
    settings["data"]["val"] = str(root / "train")
    config = tmp_path / "joint.yaml"
    config.write_text(yaml.safe_dump(settings))
    lkv_main(["fit", "--config", str(config)])
    ckpt = run / "checkpoints" / "last.ckpt"
    lkv_main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "3"])
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 3 and checkpoint["hyper_parameters"]["probe"]["hidden_dim"] == 8
    assert [g["name"] for g in checkpoint["optimizer_states"][0]["param_groups"]] == ["module", "probe"]
    capsys.readouterr()
    with pytest.raises(SystemExit):  # a resume without the probe is another run
        lkv_main(["fit", "--config", str(config), "--ckpt_path", "last", "--model.probe", "null"])
    assert re.search(r"belongs to a different run.*model\.probe: \{'hidden_dim': 8", capsys.readouterr().err)
    lkv_main(["export", "--ckpt", str(ckpt), "--output", str(tmp_path / "adapter")])
    assert "with its probe in" in capsys.readouterr().out
    model, _ = load_backbone(str(root / "model"))
    LookaheadAdapter.load(tmp_path / "adapter", model)
    assert ImportanceProbe.load(tmp_path / "adapter" / PROBE_SUBFOLDER, model).config.hidden_dim == 8
