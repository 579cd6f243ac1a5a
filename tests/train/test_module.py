"""LookaheadKVModule on tiny models: overfitting, online ground truth, checkpoints, resume, logging."""

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.core.metrics import importance_kl
from lkv.train.datamodule import LabelDataModule
from lkv.train.module import LookaheadKVModule
from tests.conftest import TINY, fit


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


def test_a_position_gap_moves_the_prompt_tail_and_the_lookahead_tokens(tiny_backbone, label_folders):
    """RoPE sees only distances: a gap cut at 0 moves everything (no change), a gap cut at the end is a pure
    lookahead offset; a gap cut inside moves the tail away from the head only. Online ground truth follows."""
    module = configured()
    from tests.model.test_lookahead import perturb_lora

    perturb_lora(module.adapter)
    data = LabelDataModule(train=str(label_folders["online"]), shuffle=False)
    data.setup("fit")
    (sample,) = next(iter(data.train_dataloader()))
    length = len(sample["prompt_ids"])
    with torch.no_grad():
        plain = module.importance(sample)
        shifted = module.importance(sample, gap=(0, 50))
        tail = module.importance(sample, gap=(length, 50))
        offset = module.importance(sample, position_offset=50)
        inside = module.importance(sample, gap=(length // 2, 50))
    for key in ("pred", "target"):
        torch.testing.assert_close(shifted[key], plain[key], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tail["pred"], offset["pred"], atol=2e-5, rtol=1e-4)
    assert (inside["pred"] - plain["pred"]).abs().max() > 1e-4
    assert (inside["target"] - plain["target"]).abs().max() > 1e-4  # the ground truth is the gapped one


def test_position_gap_draws_are_reproducible_and_bounded():
    from lkv.train.module import draw_position_gap

    draws = [draw_position_gap(500, 0, 0, b, 0, 40) for b in range(200)]
    assert draws == [draw_position_gap(500, 0, 0, b, 0, 40) for b in range(200)]
    assert all(0 <= cut <= 40 and 0 <= gap <= 500 for cut, gap in draws)
    assert len(set(draws)) > 150 and draw_position_gap(0, 0, 0, 0, 0, 40) == (0, 0)
