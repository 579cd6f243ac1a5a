"""Shared by the `lkv sweep` tests: a tiny model saved to disk with its label folders and configs."""

from pathlib import Path

import pytest
import yaml

from tests.conftest import build_tiny_model, make_label_folder


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny Llama, its train/val label folders, a 2-step fit config (no ModelCheckpoint: the sweep
    adds one) and an importance eval config."""
    root = tmp_path_factory.mktemp("sweep")
    model, tokenizer = build_tiny_model("llama")
    folder = root / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    train = make_label_folder(model, tokenizer, root / "train", num=3)
    val = make_label_folder(model, tokenizer, root / "val", num=2, seed=1)
    fit = {
        "trainer": {
            "accelerator": "cpu",
            "max_epochs": 1,
            "limit_train_batches": 2,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "model": {"model": str(folder), "num_lookahead": 2, "snapkv_window": 4, "eval_budgets": [4, 8]},
        "data": {"train": str(train), "val": str(val)},
    }
    (root / "fit.yaml").write_text(yaml.safe_dump(fit))
    evaluation = {
        "model": str(folder),
        "methods": ["lookaheadkv"],
        "tasks": [
            {"class_path": "lkv.eval.tasks.ImportanceTask", "init_args": {"folder": str(val), "budgets": [4]}}
        ],
    }
    (root / "eval.yaml").write_text(yaml.safe_dump(evaluation))
    return {"root": root, "fit": root / "fit.yaml", "eval": root / "eval.yaml"}
