"""The `lkv label --config` recipes under configs/recipes/labels/ parse, build their prompt source without
reading a document, say how they are run, and write the folders the fit configs that name them train on."""

from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

import lkv.commands.label
from lkv.cli import main as lkv_main
from lkv.labels.prompts import PromptSource
from tests.shipped_configs import ROOT

LABEL_CONFIGS = sorted((ROOT / "configs" / "recipes" / "labels").glob("*.yaml"))


def test_the_label_recipes_are_found():
    assert {"agnostic_multiq_train.yaml", "agnostic_multiq_dev.yaml"} <= {p.name for p in LABEL_CONFIGS}


@pytest.mark.parametrize("path", LABEL_CONFIGS, ids=lambda p: p.name)
def test_label_config_parses_and_builds_its_prompt_source(path: Path, capsys):
    relative = path.relative_to(ROOT)
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"lkv label --config {relative}" in line for line in header), "no exact command"
    assert any("Hardware" in line for line in header), "no Hardware line"
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["label", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["output"] and printed["prompts"]["class_path"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(lkv.commands.label.label)
    built = parser.instantiate(parser.parse_args(["--config", str(path)]))
    assert isinstance(built.prompts, PromptSource)


def test_the_agnostic_fit_trains_on_the_agnostic_recipes_folders():
    fit = yaml.safe_load((ROOT / "configs" / "agnostic_smollm2.yaml").read_text())
    outputs = {
        p.stem: yaml.safe_load(p.read_text())["output"]
        for p in LABEL_CONFIGS
        if p.stem.startswith("agnostic")
    }
    assert outputs["agnostic_multiq_train"] in fit["data"]["train"]
    assert fit["data"]["val"] == outputs["agnostic_multiq_dev"]
    for path in LABEL_CONFIGS:
        if path.stem.startswith("agnostic"):
            assert yaml.safe_load(path.read_text())["label_mode"] == "agnostic", path.name
