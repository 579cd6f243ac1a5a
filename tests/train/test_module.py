"""LookaheadKVModule on tiny models: overfitting, online ground truth, checkpoints, resume, logging."""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lkv.train.module
from lkv.core.metrics import importance_kl
from lkv.train.callbacks import ImportanceImages
from lkv.train.datamodule import LabelDataModule
from lkv.train.module import LookaheadKVModule
from tests.conftest import build_tiny_model, make_label_folder

TINY = {"num_lookahead": 4, "lr": 1e-2, "snapkv_window": 8, "snapkv_kernel": 3, "eval_budgets": (4, 8)}


@pytest.fixture
def tiny_backbone(monkeypatch):
    """``lkv.train.module.load_backbone`` returns the tiny Llama (same weights every call); yields its family name."""
    monkeypatch.setattr(lkv.train.module, "load_backbone", lambda model, **kw: build_tiny_model("llama"))
    return "llama"


@pytest.fixture(scope="module")
def label_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny-Llama label folders: ``train`` (6), ``val`` (2), ``online`` (= ``val`` without scores), ``qwen``."""
    root = tmp_path_factory.mktemp("labels")
    model, tokenizer = build_tiny_model("llama")
    qwen, qwen_tokenizer = build_tiny_model("qwen")
    return {
        "train": make_label_folder(model, tokenizer, root / "train", num=6),
        "val": make_label_folder(model, tokenizer, root / "val", num=2, seed=1),
        "online": make_label_folder(model, tokenizer, root / "online", num=2, seed=1, store_scores=False),
        "qwen": make_label_folder(qwen, qwen_tokenizer, root / "qwen", num=1),
    }


def configured(**overrides) -> LookaheadKVModule:
    module = LookaheadKVModule(model="tiny", **{**TINY, **overrides})
    module.configure_model()
    return module


def test_a_few_steps_on_a_fixed_batch_lower_the_loss(tiny_backbone):
    module = configured()
    gen = torch.Generator().manual_seed(0)
    layers, kv_heads = 3, 2
    # peaked synthetic targets: far from what the untrained lookahead tokens attend to
    batch = [
        {
            "id": f"x{i}",
            "prompt_ids": torch.randint(0, 300, (length,), generator=gen),
            "response_ids": torch.zeros(0, dtype=torch.long),
            "scores": torch.softmax(3 * torch.randn(layers, kv_heads, length, generator=gen), dim=-1),
        }
        for i, length in enumerate((24, 31))
    ]
    optimizer = torch.optim.Adam(module.adapter.trainable_parameters().values(), lr=1e-2)
    losses = []
    for _ in range(12):
        optimizer.zero_grad()
        loss = torch.stack(
            [importance_kl(s["scores"], module.importance(s)["pred"]).mean() for s in batch]
        ).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses


def test_online_ground_truth_equals_stored_labels(tiny_backbone, label_folders):
    module = configured()
    stored, online = (LabelDataModule(train=str(label_folders[k]), shuffle=False) for k in ("val", "online"))
    for dm in (stored, online):
        dm.setup("fit")
    for (a,), (b,) in zip(stored.train_dataloader(), online.train_dataloader(), strict=True):
        assert b["scores"] is None
        with torch.no_grad():
            got = module.importance(b, snapkv=True)
            want = module.importance(a, snapkv=True)
        torch.testing.assert_close(got["target"], want["target"], atol=1e-6, rtol=0)
        torch.testing.assert_close(got["pred"], want["pred"], atol=0, rtol=0)


class CountSteps(L.Callback):
    def __init__(self) -> None:
        self.batches = 0
        self.start_embeddings = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start_embeddings = pl_module.adapter.embeddings.detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1


def fit(
    root: Path, folders: dict[str, Path], max_steps: int, ckpt_path: str | None = None, train: str = "train"
):
    counter = CountSteps()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=TensorBoardLogger(root, name="tb"),
        callbacks=[
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True),
            ImportanceImages(),
            counter,
        ],
        val_check_interval=3,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = LookaheadKVModule(model="tiny", **TINY)
    data = LabelDataModule(train=str(folders[train]), val=str(folders["val"]))
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer, module, counter


def test_checkpoint_holds_only_trainable_weights_and_resumes(tiny_backbone, label_folders, tmp_path):
    trainer, module, counter = fit(tmp_path, label_folders, max_steps=3)
    assert counter.batches == 3
    metrics = trainer.callback_metrics
    for name in (
        "val/kl",
        "val/recall@4",
        "val/recall@8",
        "val/kendall_tau",
        "val/snapkv_recall@8",
        "val/snapkv_kendall_tau",
        "train/loss",
    ):
        assert name in metrics, name
    assert 0.0 <= metrics["val/recall@8"] <= 1.0 and -1.0 <= metrics["val/kendall_tau"] <= 1.0

    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    trainable = module.adapter.trainable_parameters()
    assert set(checkpoint["state_dict"]) == {f"adapter.{n}" for n in trainable}
    assert not any("base_layer" in k or "embed_tokens" in k or "norm" in k for k in checkpoint["state_dict"])
    assert checkpoint["optimizer_states"]
    trainable_bytes = sum(p.numel() * 4 for p in trainable.values())
    frozen_bytes = sum(p.numel() * 4 for p in module.adapter.model.parameters()) - trainable_bytes
    # weights + two Adam moments + bookkeeping; the frozen model alone would be larger
    assert last.stat().st_size < 3 * trainable_bytes + 64_000 < frozen_bytes + 3 * trainable_bytes
    saved = checkpoint["state_dict"]["adapter.embeddings"]

    _, resumed, counter = fit(tmp_path, label_folders, max_steps=5, ckpt_path="last")
    assert counter.batches == 2  # steps 4 and 5 only
    torch.testing.assert_close(counter.start_embeddings, saved, atol=0, rtol=0)
    assert not torch.equal(resumed.adapter.embeddings.detach(), saved)

    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0}).Reload()
    assert "val/importance" in events.Tags()["images"]
    assert "val/recall@8" in events.Tags()["scalars"]
    assert "num_lookahead: 4" in (tmp_path / "tb" / "version_0" / "hparams.yaml").read_text()


def test_fit_refuses_labels_of_another_model(tiny_backbone, label_folders, tmp_path):
    with pytest.raises(
        ValueError, match=r"label folder .*qwen \(train\).*'tiny' \(qwen3.*loaded model is 'tiny' \(llama"
    ):
        fit(tmp_path, label_folders, max_steps=1, train="qwen")
