"""`lkv export`: checkpoint → standalone adapter folder → same predictions from the base model alone."""

import pytest
import torch

from lkv.cli import main as lkv_main
from lkv.core.generation import prefill
from lkv.model.lookahead import CONFIG_FILE, EMBEDDINGS_FILE, LookaheadAdapter
from lkv.train.module import LookaheadKVModule
from tests.conftest import build_tiny_model, fit


@pytest.fixture
def checkpoint(tiny_backbone, label_folders, tmp_path):  # noqa: F811
    trainer, module, _ = fit(tmp_path, label_folders, max_steps=3)
    return tmp_path / "checkpoints" / "last.ckpt", module


def test_export_then_load_reproduces_predicted_scores(checkpoint, tmp_path):
    ckpt, trained = checkpoint
    out = tmp_path / "adapter"
    lkv_main(["export", "--ckpt", str(ckpt), "--output", str(out)])
    assert {CONFIG_FILE, EMBEDDINGS_FILE, "adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in out.iterdir()
    }
    assert '"num_layers": 3' in (out / CONFIG_FILE).read_text()  # the base model's signature
    base, _ = build_tiny_model("llama")
    loaded = LookaheadAdapter.load(out, base)
    ids = torch.randint(0, 300, (1, 27), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = loaded.predict(prefill(loaded.model, ids)[0], 27)
        want = trained.adapter.predict(prefill(trained.adapter.model, ids)[0], 27)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    # trained, so not the untrained module's prediction
    fresh = LookaheadAdapter.create(build_tiny_model("llama")[0], num_tokens=4)
    with torch.no_grad():
        untrained = fresh.predict(prefill(fresh.model, ids)[0], 27)
    assert not torch.equal(got, untrained)


def test_checkpoint_of_another_configuration_is_refused(checkpoint):
    ckpt, _ = checkpoint
    with pytest.raises(ValueError, match="checkpoint does not match .*unexpected"):
        LookaheadKVModule.load_from_checkpoint(
            ckpt, map_location="cpu", weights_only=False, lora_targets="none"
        )


def test_export_missing_checkpoint(tmp_path):
    from lkv.commands.export import export

    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        export(str(tmp_path / "nope.ckpt"), str(tmp_path / "out"))
