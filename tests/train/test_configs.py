"""Every LightningCLI config under configs/ parses (`--print_config`) without loading any weights.

Configs of the other verbs (configs/eval, configs/sweeps, configs/demo, and any YAML without a top-level
``model:`` or ``trainer:`` key) are parsed by their own verbs' tests.
"""

import shlex
from pathlib import Path

import pytest
import yaml

import lkv.train.module
from lkv.cli import main as cli_main
from lkv.train.cli import lightning_main

ROOT = Path(__file__).resolve().parents[2]
OTHER_VERBS = ("eval", "sweeps", "demo")


def lightning_configs() -> list[Path]:
    found = []
    for path in sorted((ROOT / "configs").glob("**/*.yaml")):
        relative = path.relative_to(ROOT / "configs")
        if relative.parts[0] in OTHER_VERBS:
            continue
        content = yaml.safe_load(path.read_text()) or {}
        if isinstance(content, dict) and ({"model", "trainer"} & set(content)):
            found.append(path)
    return found


CONFIGS = lightning_configs()


def test_the_shipped_recipes_are_found():
    names = {p.name for p in CONFIGS}
    assert {"smollm2_135m.yaml", "llama3_8b.yaml", "qwen3_8b.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_config_parses_without_loading_weights(path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("parsing a config must not load a model")

    monkeypatch.setattr(lkv.train.module, "load_backbone", refuse)
    relative = path.relative_to(ROOT)
    header = path.read_text().splitlines()
    assert header[0].startswith("# "), f"{relative}: must start with a comment header"
    assert any(f"lkv fit --config {relative}" in line for line in header if line.startswith("#")), (
        f"{relative}: the header must give the exact command `lkv fit --config {relative}`"
    )
    assert any("Hardware" in line for line in header if line.startswith("#")), f"{relative}: no Hardware line"
    with pytest.raises(SystemExit) as exit_info:
        lightning_main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["num_lookahead"] == yaml.safe_load(path.read_text())["model"]["num_lookahead"]
    assert {"trainer", "model", "data"} <= set(printed)


def header_label_commands(path: Path) -> list[list[str]]:
    """The ``lkv label`` commands of a config header, continuation lines joined and ``$L`` expanded."""
    lines = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    text = "\n".join(lines)
    shared = text.split('L="', 1)[1].split('"', 1)[0] if 'L="' in text else ""
    commands, current = [], None
    for line in lines:
        if line.startswith("lkv label"):
            current = []
            commands.append(current)
        elif current is None or not line.startswith("--"):
            current = None
            continue
        current += shlex.split(line.split("#", 1)[0].split("(", 1)[0].replace("$L", shared))
    return [command[2:] for command in commands]  # without "lkv label"


PAPER_CONFIGS = [p for p in CONFIGS if p.name != "smollm2_135m.yaml"]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_configs_label_each_source_into_the_folders_they_train_on(path, capsys):
    # one documented `lkv label` command per source, each into its own folder: exactly data.train + data.val
    data = yaml.safe_load(path.read_text())["data"]
    commands = header_label_commands(path)
    outputs = []
    for args in commands:
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["label", *args, "--print_config"])
        assert exit_info.value.code in (0, None), args
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["model"] == yaml.safe_load(path.read_text())["model"]["model"]
        assert (printed["response_tokens"], printed["store_scores"]) == (512, False)
        outputs.append(printed["output"])
    assert outputs == [*data["train"], data["val"]] and len(data["train"]) == 4
