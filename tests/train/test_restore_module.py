"""RestoreKV's self-distillation on a tiny model: the KL falls in a few steps, gradients reach the restore
tokens only, and a checkpoint exports to the folder the press loads."""

import json
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader
from torchmetrics import Metric, MetricCollection

import lkv.train.restore_module
from lkv.cli import main as lkv_main
from lkv.core.generation import prefill
from lkv.eviction.registry import make_method
from lkv.model.restore import RestoreAdapter
from lkv.train.export import export_checkpoint
from lkv.train.optim import OptimSettings
from lkv.train.restore_module import RestoreKVModule
from tests.cli.conftest import fit_settings, make_workspace
from tests.conftest import build_tiny_model

# C = 6 of 40-48 tokens: 2 context entries per KV head beside the 4 restore tokens
TINY = {"num_restore": 4, "lora_rank": 4, "budget": 6, "chunk_size": 16, "optim": OptimSettings(lr=1e-3)}


@pytest.fixture(autouse=True)
def tiny_backbone(monkeypatch):
    """``lkv.train.restore_module.load_backbone`` returns the tiny Llama (same weights every call)."""
    monkeypatch.setattr(
        lkv.train.restore_module, "load_backbone", lambda model, **kw: build_tiny_model("llama")
    )


def configured(**overrides) -> RestoreKVModule:
    module = RestoreKVModule(model="tiny", **{**TINY, **overrides})
    module.configure_model()
    return module


def batch(lengths=(40, 48)) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    return [
        {
            "id": f"x{i}",
            "prompt_ids": torch.randint(3, 300, (length,), generator=gen),
            "response_ids": torch.randint(3, 300, (10,), generator=gen),
            "scores": None,
        }
        for i, length in enumerate(lengths)
    ]


def test_a_few_steps_lower_the_kl_and_train_the_restore_tokens_only():
    module = configured()
    samples = batch()
    params = list(module.trainable_parameters().values())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    frozen = [p for n, p in module.named_parameters() if n not in module.trainable_parameters()]
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = torch.stack([module.distillation(s) for s in samples]).mean()
        loss.backward()
        if not losses:
            assert all(p.grad is not None for p in params) and module.restore.embeddings.grad.abs().sum() > 0
            assert all(p.grad is None for p in frozen)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses
    # the reference line: KVzip alone at the whole budget C; the trained restore tokens do better
    with torch.no_grad():
        kvzip = torch.stack([module.distillation(s, restored=False) for s in samples]).mean()
    assert losses[-1] < float(kvzip), (losses, float(kvzip))
    assert module.distillation({**samples[0], "prompt_ids": samples[0]["prompt_ids"][:6]}) is None


def test_a_checkpoint_exports_the_folder_the_press_loads(tmp_path):
    module = configured()
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch()], batch_size=None, collate_fn=lambda b: b))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert set(torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"]) == set(
        module.trainable_parameters()
    )
    message = export_checkpoint(tmp_path / "last.ckpt", tmp_path / "restore", model="tiny")
    assert message.startswith("exported the n=4 restore module")
    assert RestoreAdapter.read_folder(tmp_path / "restore").extra == {"model": "tiny", "setting": "aware"}

    fresh, _ = build_tiny_model("llama")
    press = make_method("restorekv", folder=tmp_path / "restore", model=fresh, chunk_size=16)
    ids = batch()[0]["prompt_ids"][None]
    cache, _ = prefill(fresh, ids)
    got = press.adapter.restore(cache, ids.shape[1])
    cache, _ = prefill(module.restore.base_model, ids)
    with torch.no_grad():
        want = module.restore.restore(cache, ids.shape[1])
    for mine, theirs in zip(got.keys + got.values, want.keys + want.values, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)


def test_agnostic_labels_are_refused_before_any_step():
    """An agnostic label row is a context and its answers without the questions: distilling it after the
    restore tokens would train them on answers to questions never asked."""
    module = RestoreKVModule(model="tiny", **TINY)
    labels = SimpleNamespace(label_setting=lambda: "agnostic")
    module._trainer = SimpleNamespace(
        datamodule=labels, strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )
    with pytest.raises(
        ValueError, match="these label folders are agnostic .* `lkv label --label_mode aware`"
    ):
        module.configure_model()
    assert module.restore is None


def test_a_fit_logs_exactly_the_distillation_metrics(tmp_path):
    """What a fit, its validation and a test log: the distillation losses, nothing of the importance
    predictors' ranking metrics (the module holds none)."""
    module = configured()
    assert not [name for name, m in module.named_modules() if isinstance(m, (Metric, MetricCollection))]
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=TensorBoardLogger(tmp_path, name="tb", version="v", default_hp_metric=False),
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader([batch()], batch_size=None, collate_fn=lambda b: b)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    trainer.test(module, dataloaders=loader)
    scalars = EventAccumulator(str(tmp_path / "tb" / "v")).Reload().Tags()["scalars"]
    assert set(scalars) == {"epoch", "train/loss", "train/prompt_tokens"} | {
        f"{stage}/{name}" for stage in ("val", "test") for name in ("kl", "kvzip_kl")
    }


def test_lkv_fit_export_and_generate_with_restorekv(tmp_path, capsys, monkeypatch):
    monkeypatch.undo()  # the real loader: `lkv fit` reads the tiny model's saved folder
    root = make_workspace(tmp_path)
    run = tmp_path / "run"
    settings = fit_settings(root, run, max_steps=3)
    settings["trainer"]["callbacks"] = settings["trainer"]["callbacks"][:1]  # the checkpoint after every step
    settings["model"] = {
        "class_path": "lkv.train.restore_module.RestoreKVModule",
        "init_args": {
            "model": str(root / "model"),
            "num_restore": 2,
            "lora_rank": 2,
            "budget": 8,
            "chunk_size": 16,
            "optim": {"lr": 1e-3},
        },
    }
    config = tmp_path / "restorekv.yaml"
    config.write_text(yaml.safe_dump(settings))
    lkv_main(["fit", "--config", str(config)])
    ckpt = run / "checkpoints" / "last.ckpt"
    assert all(key.startswith("restore.") for key in torch.load(ckpt, weights_only=False)["state_dict"])
    lkv_main(["export", "--ckpt", str(ckpt), "--output", str(tmp_path / "restore")])
    assert "exported the n=2 restore module" in capsys.readouterr().out
    folder = str(tmp_path / "restore")
    lkv_main(
        ["generate", "--prompt", "alpha beta gamma " * 8, "--method", "restorekv", "--budget", "8"]
        + ["--press_args", f"{{folder: {folder}, chunk_size: 16}}", "--max_new_tokens", "3"]
    )
    assert "[restorekv, budget 8," in capsys.readouterr().err

    # `lkv eval`: two RestoreKV entries side by side (`restorekv` and the variant `restorekv:wide`), each with its
    # own settings
    from tests.conftest import ESSAYS, TINY_HELDOUT

    essays = tmp_path / "essays"
    essays.mkdir()
    for name, text in ESSAYS.items():
        (essays / f"{name}.txt").write_text(text)
    task = {"lengths": [60], "depths": [0.5], "essays_dir": str(essays), "heldout_fraction": TINY_HELDOUT}
    suite = {
        "tasks": [{"class_path": "lkv.eval.tasks.NeedleTask", "init_args": task}],
        "model": str(root / "model"),
        "methods": ["fullkv", "restorekv"],
        "variants": ["restorekv:wide"],
        "budgets": [8],
        "press_args": {
            "restorekv": {"folder": folder, "chunk_size": 16},
            "restorekv:wide": {"folder": folder, "chunk_size": 32},
        },
        "progress": False,
    }
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(suite))
    capsys.readouterr()
    lkv_main(["eval", "--config", str(tmp_path / "eval.yaml"), "--output", str(tmp_path / "eval")])
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert warned == [
        f"lkv eval: warning: {method}'s module {folder} was trained for the aware setting "
        "(restorekv.json extra.setting) and runs here in the agnostic setting too"
        for method in ("restorekv", "restorekv:wide")
    ]
    run_json = json.loads((tmp_path / "eval" / "run.json").read_text())
    assert {m: a["chunk_size"] for m, a in run_json["press_args"].items()} == {
        "restorekv": 16,
        "restorekv:wide": 32,
    }
    rows = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"fullkv", "restorekv", "restorekv:wide"}
