"""The shipped `lkv label` configs (configs/recipes/labels) parse with `lkv label`'s parser and build their prompt
source without loading a model, and the fit configs that train on them say how to make their labels and
train on the folders they write."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

import lkv.commands.label
from lkv.cli import main as lkv_main
from lkv.train.cli import resolved_fit_config
from tests.shipped_configs import ROOT, shipped_configs

LABEL_CONFIGS = [p for p in shipped_configs() if p.is_relative_to(ROOT / "configs" / "recipes" / "labels")]
GENERAL = ROOT / "configs" / "general_smollm2.yaml"


def header(path: Path) -> list[str]:
    return [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]


def printed_label_config(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["label", *args, "--print_config"])
    assert exit_info.value.code in (0, None), args
    return yaml.safe_load(capsys.readouterr().out)


def test_the_label_configs_are_found():
    assert {p.name for p in LABEL_CONFIGS} == {
        "general_smollm2.yaml",
        "my_documents_smollm2.yaml",
        "agnostic_multiq_train.yaml",
        "agnostic_multiq_dev.yaml",
    }


@pytest.mark.parametrize("path", LABEL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_label_config_parses_and_builds_its_prompts(path, capsys):
    relative = path.relative_to(ROOT)
    assert any(f"lkv label --config {relative}" in line for line in header(path)), "no exact command"
    assert any(line.startswith("Hardware") for line in header(path)), "no Hardware line"
    printed = printed_label_config(["--config", str(path)], capsys)
    assert printed["output"] and printed["prompts"]["class_path"].startswith("lkv.labels.")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(lkv.commands.label.label)
    built = parser.instantiate(parser.parse_args(["--config", str(path)]))  # checks the source's settings
    assert built.prompts.describe().startswith(printed["prompts"]["class_path"].rsplit(".", 1)[1])


def test_the_general_recipe_trains_on_the_mix_labels_made_as_its_header_says(capsys):
    config = resolved_fit_config(GENERAL)
    label_config = ROOT / "configs" / "recipes" / "labels" / "general_smollm2.yaml"
    assert any(f"lkv label --config {label_config.relative_to(ROOT)}" in line for line in header(GENERAL))
    from_file = printed_label_config(["--config", str(label_config)], capsys)
    assert from_file["output"] in config["data"]["train"]
    assert config["model"]["probe"]["preset"] == "long"  # the joint fit of configs/long_smollm2.yaml
    # the header's spelled-out command is the label config's
    lines = header(GENERAL)
    start = lines.index(
        next(line for line in lines if line.startswith(f"lkv label --output {from_file['output']}"))
    )
    command = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("--"):
            break
        command.append(line)
    words = shlex.split(" ".join(command).split(")", 1)[0])[2:]
    assert printed_label_config(words, capsys) == from_file


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
