"""The per-token probe (KVzap-style) on tiny models: training on either target, the probe's scores against an
independent forward, and `lkv fit` → `lkv export` → press / `lkv generate` through the real entry points."""

import json
import re
from dataclasses import asdict

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

import lkv.train.probe_module
from lkv.cli import main as lkv_main
from lkv.core.generation import prefill
from lkv.core.metrics import importance_kl, topk_recall
from lkv.core.reconstruction import kvzip_plus_scores, reconstruction_block
from lkv.eval.results import fingerprint
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import ProbePress
from lkv.labels.shards import load_labels, read_meta, row_scores
from lkv.model.backbone import load_backbone
from lkv.model.probe import PROBE_CONFIG_FILE, PROBE_WEIGHTS_FILE, ImportanceProbe
from lkv.train.callbacks import ImportanceImages
from lkv.train.datamodule import LabelDataModule
from lkv.train.export import load_checkpoint, resolve_probe
from lkv.train.optim import OptimSettings
from lkv.train.probe_module import ProbeModule
from tests.cli.conftest import fit_settings, make_workspace
from tests.conftest import TINY_EVAL, build_tiny_model

TINY_PROBE = {"hidden_dim": 8, "optim": OptimSettings(lr=1e-2), **TINY_EVAL}


@pytest.fixture
def tiny_probe_backbone(monkeypatch):
    """``lkv.train.probe_module.load_backbone`` returns the tiny Llama (same weights every call)."""
    monkeypatch.setattr(
        lkv.train.probe_module, "load_backbone", lambda model, **kw: build_tiny_model("llama")
    )


def configured(**overrides) -> ProbeModule:
    module = ProbeModule(model="tiny", **{**TINY_PROBE, **overrides})
    module.configure_model()
    return module


def synthetic_batch(lengths=(24, 31)) -> list[dict]:
    """Prompts with peaked random targets (3 layers, 2 KV heads): far from an untrained probe's scores."""
    gen = torch.Generator().manual_seed(0)
    return [
        {
            "id": f"x{i}",
            "prompt_ids": torch.randint(0, 300, (length,), generator=gen),
            "response_ids": torch.zeros(0, dtype=torch.long),
            "scores": torch.softmax(3 * torch.randn(3, 2, length, generator=gen), dim=-1),
        }
        for i, length in enumerate(lengths)
    ]


def train_steps(module: ProbeModule, batch: list[dict], steps: int) -> list[float]:
    optimizer = torch.optim.Adam(module.trainable_parameters().values(), lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.stack([module.loss(s, module.importance(s)) for s in batch]).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("hidden_dim", [0, 8], ids=["linear", "mlp"])
def test_a_few_steps_on_the_labels_lower_the_kl(tiny_probe_backbone, hidden_dim):
    module = configured(hidden_dim=hidden_dim)
    batch = synthetic_batch()
    scores = module.importance(batch[0])
    assert scores["pred"].shape == (3, 2, 24)
    torch.testing.assert_close(scores["pred"].sum(-1), torch.ones(3, 2))
    # the loss is LookaheadKV's: KL(s_GT ‖ softmax over S of the logits), averaged over (layer, KV head)
    want = importance_kl(batch[0]["scores"], torch.softmax(scores["logits"], -1)).mean()
    torch.testing.assert_close(module.loss(batch[0], scores), want)
    losses = train_steps(module, batch, 15)
    assert losses[-1] < 0.7 * losses[0], losses
    assert set(module.trainable_state_names()) == {f"probe.{n}" for n, _ in module.probe.named_parameters()}


def test_the_kvzip_target_regresses_kvzip_plus_log_scores(tiny_probe_backbone):
    module = configured(target="kvzip")
    sample = synthetic_batch()[0]
    scores = module.importance(sample)
    ids = sample["prompt_ids"]
    block = torch.tensor([reconstruction_block(module.tokenizer, ids.tolist())])
    cache, _ = prefill(module.backbone, ids[None])
    wanted = kvzip_plus_scores(module.backbone, cache, 24, block, repeated=24)
    assert wanted.isfinite().all()
    torch.testing.assert_close(module.loss(sample, scores), ((scores["logits"] - wanted) ** 2).mean())
    losses = train_steps(module, [sample], 15)
    assert losses[-1] < 0.5 * losses[0], losses


def test_fit_logs_lookaheadkvs_metrics_and_keeps_only_the_probe(tiny_probe_backbone, label_folders, tmp_path):
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True), ImportanceImages()],
        val_check_interval=3,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = ProbeModule(model="tiny", **TINY_PROBE)
    trainer.fit(module, LabelDataModule(train=str(label_folders["train"]), val=str(label_folders["val"])))
    for name in ("train/loss", "val/kl", "val/recall@4", "val/recall@8", "val/kendall_tau"):
        assert name in trainer.callback_metrics, name
    assert "val/snapkv_recall@8" in trainer.callback_metrics
    module.train()
    assert module.probe.training and not module.backbone.training  # the frozen LLM stays in eval mode
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert set(checkpoint["state_dict"]) == {f"probe.{n}" for n, _ in module.probe.named_parameters()}


def test_the_press_equals_the_probe_on_an_independent_forward(tiny_model):
    """Scores from the prefill's hook = softmax of the probe applied by hand to
    ``input_layernorm`` of the residual stream that ``output_hidden_states`` returns."""
    model, tokenizer = tiny_model
    probe = ImportanceProbe.create(model, hidden_dim=8, seed=3)
    press = ProbePress(probe)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        residual = model(ids, output_hidden_states=True).hidden_states
        layers = model.get_decoder().layers
        want = torch.stack(
            [
                torch.softmax(probe.layers[i](layer.input_layernorm(residual[i])).transpose(1, 2), -1)
                for i, layer in enumerate(layers)
            ],
            dim=1,
        )
    got = Compressor(model, tokenizer, press, budget=10).score(ids).scores
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_a_probe_for_another_shape_is_refused(make_tiny_model, tmp_path):
    llama, _ = make_tiny_model("llama")
    qwen, _ = make_tiny_model("qwen")
    ImportanceProbe.create(llama, hidden_dim=0).save(tmp_path / "probe")
    with pytest.raises(
        ValueError, match=r"probe: the probe was trained for .* = \(3, 64, 2\), .* has \(2, 64, 2\)"
    ):
        ProbePress.from_folder(tmp_path / "probe", qwen)


def probe_config(root, run, max_steps: int) -> dict:
    """The whole-command tests' tiny fit config (a checkpoint every step), training the probe instead."""
    settings = fit_settings(root, run, max_steps)
    settings["model"] = {
        "class_path": "lkv.train.probe_module.ProbeModule",
        "init_args": {
            "model": str(root / "model"),
            **TINY_PROBE,
            "optim": asdict(TINY_PROBE["optim"]),
            "eval_budgets": [4, 8],
        },
    }
    settings["data"]["val"] = str(root / "train")
    return settings


def test_lkv_fit_export_and_generate_with_a_probe(tmp_path, capsys):
    root = make_workspace(tmp_path)
    run = tmp_path / "run"
    config = tmp_path / "probe.yaml"
    config.write_text(yaml.safe_dump(probe_config(root, run, max_steps=3)))
    lkv_main(["fit", "--config", str(config)])
    ckpt = run / "checkpoints" / "last.ckpt"
    assert all(key.startswith("probe.") for key in torch.load(ckpt, weights_only=False)["state_dict"])
    # the same command resumes from last.ckpt (here to a 4th step); other probe settings are refused
    lkv_main(["fit", "--config", str(config), "--ckpt_path", "last", "--trainer.max_steps", "4"])
    assert torch.load(ckpt, weights_only=False)["global_step"] == 4
    capsys.readouterr()
    with pytest.raises(SystemExit):
        lkv_main(["fit", "--config", str(config), "--ckpt_path", "last", "--model.init_args.hidden_dim", "4"])
    assert re.search(
        r"lkv fit: error: .*belongs to a different run.*model\.hidden_dim: 8 vs 4", capsys.readouterr().err
    )

    lkv_main(["export", "--ckpt", str(ckpt), "--output", str(tmp_path / "probe")])
    assert "exported the MLP hidden 8 probe (3 layers, target labels)" in capsys.readouterr().out
    assert {PROBE_CONFIG_FILE, PROBE_WEIGHTS_FILE} == {p.name for p in (tmp_path / "probe").iterdir()}
    assert '"num_layers": 3' in (tmp_path / "probe" / PROBE_CONFIG_FILE).read_text()  # the signature
    model, tokenizer = load_backbone(str(root / "model"))
    press = ProbePress.from_folder(tmp_path / "probe", model)
    trained = load_checkpoint(ckpt)
    sample = {"prompt_ids": torch.arange(3, 40), "scores": torch.zeros(3, 2, 37), "response_ids": None}
    with torch.no_grad():
        want = trained.importance(sample)["pred"]
    got = Compressor(model, tokenizer, press, budget=8).score(torch.arange(3, 40)).scores[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # trained: not what the probe predicted before its first step
    fresh = ProbePress(ImportanceProbe.create(model, hidden_dim=8, seed=0))
    assert not torch.allclose(
        got, Compressor(model, tokenizer, fresh, budget=8).score(torch.arange(3, 40)).scores[0]
    )

    assert resolve_probe(ckpt) == run / "checkpoints" / "last-probe"  # a checkpoint is exported beside itself
    lkv_main(["generate", "--prompt", "alpha beta gamma " * 8, "--method", "probe", "--probe", str(ckpt)])
    assert "[probe, budget 128," in capsys.readouterr().err

    # `lkv eval --probe`: the importance task ranks the probe's scores against the labels
    task = {
        "class_path": "lkv.eval.tasks.ImportanceTask",
        "init_args": {"folder": str(root / "train"), "budgets": [4]},
    }
    suite = {"tasks": [task], "methods": ["snapkv", "probe"], "model": str(root / "model"), "progress": False}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(suite))
    output = tmp_path / "eval"
    lkv_main(
        [
            "eval",
            "--config",
            str(tmp_path / "eval.yaml"),
            "--probe",
            str(tmp_path / "probe"),
            "--output",
            str(output),
        ]
    )
    assert json.loads((output / "run.json").read_text())["probe"] == fingerprint(tmp_path / "probe")
    rows = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    label = load_labels(root / "train")[0]
    (row,) = [r for r in rows if r["method"] == "probe" and r["sample"] == label["id"]]
    scores = Compressor(model, tokenizer, press).score(torch.tensor(label["prompt_ids"])).scores[0]
    target = row_scores(label, read_meta(root / "train"))
    assert row["metrics"]["recall@4"] == pytest.approx(topk_recall(scores, target, 4).mean().item())
