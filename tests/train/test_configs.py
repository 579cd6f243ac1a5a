"""Every LightningCLI config under configs/ and experiments/<study>/configs/ parses (`--print_config`) without
loading any weights.

Configs of the other verbs (configs/eval, configs/sweeps, configs/demo, and any YAML without a top-level
``model:`` or ``trainer:`` key) are parsed by their own verbs' tests. Files in configs/recipes/ are only
included by model files (``config: recipes/paper.yaml``); they are parsed through those.
"""

import shlex
from pathlib import Path

import pytest
import torch
import yaml

import lkv.train.module
from lkv.cli import main as cli_main
from lkv.train.cli import lightning_main, resolved_fit_config
from tests.cli.conftest import fit_settings, make_workspace
from tests.shipped_configs import ROOT, is_fit_config, shipped_configs

OTHER_VERBS = ("eval", "sweeps", "demo")
RECIPES = ROOT / "configs" / "recipes"


def lightning_configs() -> list[Path]:
    skipped = [ROOT / "configs" / folder for folder in (*OTHER_VERBS, RECIPES.name)]
    return [
        p for p in shipped_configs() if not any(p.is_relative_to(s) for s in skipped) and is_fit_config(p)
    ]


CONFIGS = lightning_configs()


def test_the_shipped_recipes_are_found():
    names = {p.name for p in CONFIGS}
    assert {"smollm2_135m.yaml", "llama3_8b.yaml", "qwen3_8b.yaml"} <= names
    assert {"reach_gold_smollm2.yaml", "length_mix_smollm2.yaml"} <= names  # the studies' fits


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
    assert {"trainer", "model", "data"} <= set(printed)
    for key, value in own_settings(path).items():  # the file's own values win over any include's
        assert dotted(printed, key) == value, f"{relative}: {key}"


def own_settings(path: Path) -> dict[str, object]:
    """The values a config file sets itself, by dotted key, its ``config:`` include left out; a list of
    class_path dicts (callbacks) as its class paths, since the parser fills in every default argument."""
    flat: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
            flat[f"{prefix}class_path"] = [v["class_path"] for v in node]
        else:
            flat[prefix[:-1]] = node

    walk({k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "config"}, "")
    return flat


def dotted(config: dict, key: str) -> object:
    node: object = config
    for part in key.split("."):
        if part == "init_args" and isinstance(node, dict) and part not in node:
            # an optional dataclass (model.probe) is overridden as `init_args.KEY` and printed flat
            continue
        node = [item[part] for item in node] if isinstance(node, list) else node[part]
    return node


def test_every_recipe_is_included_and_model_files_differ_only_where_they_say():
    including = {p: yaml.safe_load(p.read_text()).get("config") for p in CONFIGS}
    for recipe in sorted(RECIPES.glob("*.yaml")):
        users = [
            p for p, include in including.items() if include and (p.parent / include).resolve() == recipe
        ]
        assert users, f"{recipe.relative_to(ROOT)} is included by no model config"
        resolved = {p: resolved_fit_config(p) for p in users}
        recipe_keys = own_settings(recipe)
        for path, config in resolved.items():
            overridden = {k for k in own_settings(path) if k.startswith(tuple(f"{r}." for r in recipe_keys))}
            for key, value in recipe_keys.items():
                if key not in own_settings(path) and key not in overridden:
                    assert dotted(config, key) == value, f"{path.name}: {key} should come from {recipe.name}"


def test_a_broken_include_names_the_file(tmp_path):
    config = tmp_path / "model.yaml"
    config.write_text("config: recipes/missing.yaml\n")
    with pytest.raises(ValueError, match="model.yaml"):
        resolved_fit_config(config)


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


def base_model(path: Path) -> object:
    """The config's own base model: ``model.model``, or ``model.init_args.model`` beside a ``class_path``."""
    settings = own_settings(path)
    return settings.get("model.model", settings.get("model.init_args.model"))


# the embedded default's recipes (smollm2_135m.yaml, the probe, the ablations on it) share its header's labels
PAPER_CONFIGS = [p for p in CONFIGS if base_model(p) != "smollm2-135m"]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_configs_label_each_source_into_the_folders_they_train_on(path, capsys):
    # one documented `lkv label` command per source, each into its own folder: exactly data.train + data.val
    config = resolved_fit_config(path)
    data = config["data"]
    commands = header_label_commands(path)
    outputs = []
    for args in commands:
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["label", *args, "--print_config"])
        assert exit_info.value.code in (0, None), args
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["model"] == config["model"]["model"]
        # responses only, decoded 8 at a time (docs/performance.md: ~6 h instead of ~32 h at batch 1)
        assert (printed["response_tokens"], printed["store_scores"], printed["batch_size"]) == (512, False, 8)
        outputs.append(printed["output"])
    assert outputs == [*data["train"], data["val"]] and len(data["train"]) == 4


def test_a_config_that_includes_the_probe_trains_the_probe(tmp_path):
    # the module class comes from `model.class_path`, found through the include
    config = tmp_path / "linear_probe.yaml"
    config.write_text(f"config: {ROOT / 'configs' / 'probe_smollm2.yaml'}\nmodel.init_args.hidden_dim: 0\n")
    resolved = resolved_fit_config(config)
    assert resolved["model"]["class_path"] == "lkv.train.probe_module.ProbeModule"
    assert resolved["model"]["init_args"]["hidden_dim"] == 0
    assert resolved["model"]["init_args"]["optim"]["lr"] == 5e-3  # the included recipe's


@pytest.mark.parametrize(
    ("class_path", "init_args", "lr"),
    [
        ("lkv.train.probe_module.ProbeModule", {"hidden_dim": 8, "eval_budgets": [4, 8]}, 5e-3),
        ("lkv.train.restore_module.RestoreKVModule", {"num_restore": 2, "budget": 8, "chunk_size": 16}, 1e-3),
    ],
    ids=["probe", "restorekv"],
)
def test_a_class_path_config_without_optim_trains_with_the_modules_default(
    tmp_path, class_path, init_args, lr
):
    """``model.optim`` left out of a ``class_path`` config: the chosen module's own default settings apply
    (the base class's ``optim`` must not hand jsonargparse a value that overrides them)."""
    root = make_workspace(tmp_path)
    run = tmp_path / "run"
    settings = fit_settings(root, run, max_steps=1)
    settings["trainer"]["callbacks"] = settings["trainer"]["callbacks"][:1]  # the checkpoint
    settings["model"] = {"class_path": class_path, "init_args": {"model": str(root / "model"), **init_args}}
    config = tmp_path / "fit.yaml"
    config.write_text(yaml.safe_dump(settings))
    cli_main(["fit", "--config", str(config)])
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["hyper_parameters"]["optim"]["lr"] == lr
    assert [group["initial_lr"] for group in checkpoint["optimizer_states"][0]["param_groups"]] == [lr]
