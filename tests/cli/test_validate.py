"""`lkv validate` through the real entry point: it reads a fit's checkpoint and writes nothing of its own
without a logger (LightningCLI would leave its ``config.yaml`` in the working directory)."""

from __future__ import annotations

import yaml

from lkv.cli import main as lkv_main
from tests.cli.conftest import fit_config, fit_settings, label_args, make_workspace


def test_validate_without_a_logger_leaves_the_working_directory_as_it_was(tmp_path, monkeypatch):
    root = make_workspace(tmp_path / "work")
    lkv_main(label_args(root, root / "labels", root / "prompts.jsonl"))
    lkv_main(["fit", "--config", str(fit_config(root, root / "run", max_steps=1))])
    assert (root / "run" / "config.yaml").is_file()  # a fit keeps its config beside its checkpoints
    settings = fit_settings(root, root / "unused", max_steps=1)
    del settings["trainer"]["default_root_dir"]
    settings["trainer"]["callbacks"] = []
    settings["data"]["val"] = str(root / "labels")
    config = root / "validate.yaml"
    config.write_text(yaml.safe_dump(settings))
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    lkv_main(
        ["validate", "--config", str(config), "--ckpt_path", str(root / "run" / "checkpoints" / "last.ckpt")]
    )
    assert sorted(p.name for p in here.iterdir()) == []
