"""Every bad input ends in one ``lkv VERB: error: ...`` line naming the file or field, exit status 1 and no
traceback, before any model loads where the input allows it (issue 53): damaged checkpoints, adapter and
probe folders, configs of every verb (``fit`` and ``sweep`` included), prompt files, bench settings, and the
values of a fit's hyper-parameters.

Each case prepares its input in a copy of a small workspace (the tiny Llama, its prompts, labels, an adapter
and a probe folder made in code); nothing here trains or runs a prefill.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from lkv.cli import main as lkv_main
from lkv.model.lookahead import LookaheadAdapter
from lkv.model.probe import ImportanceProbe
from tests.cli.conftest import fit_settings, label_args, make_workspace
from tests.conftest import build_tiny_model


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """:func:`make_workspace` plus ``adapter/`` and ``probe/`` folders of the tiny Llama and a ``fit.yaml``."""
    root = make_workspace(tmp_path_factory.mktemp("errors"))
    model, _ = build_tiny_model("llama")
    LookaheadAdapter.create(model, num_tokens=2, init="random_tokens").save(root / "adapter")
    ImportanceProbe.create(model, hidden_dim=0).save(root / "probe")
    settings = fit_settings(root, root / "run", max_steps=1)
    settings["trainer"]["callbacks"] = []
    (root / "fit.yaml").write_text(yaml.safe_dump(settings))
    return root


def fit_with(root: Path, **model: object) -> list[str]:
    """``lkv fit`` of ``fit.yaml`` with ``model`` merged into its ``model:`` section."""
    settings = yaml.safe_load((root / "fit.yaml").read_text())
    settings["model"].update(model)
    (root / "changed.yaml").write_text(yaml.safe_dump(settings))
    return ["fit", "--config", str(root / "changed.yaml")]


def write(root: Path, name: str, data: bytes) -> Path:
    (root / name).write_bytes(data)
    return root / name


def cut(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def truncated_checkpoint(root: Path) -> Path:
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, root / "cut.ckpt")
    return cut(root / "cut.ckpt")


def adapter_without(root: Path, damage: Callable[[Path], object]) -> list[str]:
    """``lkv generate`` with ``--adapter`` a copy of ``adapter/`` whose LoRA weights ``damage`` changed."""
    damage(root / "adapter" / "adapter_model.safetensors")
    return ["generate", "--prompt", "alpha", "--method", "lookaheadkv", "--adapter", str(root / "adapter")]


MALFORMED = b"trainer:\n  accelerator: cpu\n model: [\n"
BINARY = b"\x8c\x00\xff binary"


def sweep_with_grid(root: Path, grid: dict) -> list[str]:
    settings = yaml.safe_load((root / "fit.yaml").read_text())
    settings["trainer"]["logger"] = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger"}
    (root / "base.yaml").write_text(yaml.safe_dump(settings))
    config = {"base": str(root / "base.yaml"), "output": str(root / "sweep"), "grid": grid}
    (root / "sweep.yaml").write_text(yaml.safe_dump(config))
    return ["sweep", "--config", str(root / "sweep.yaml")]


def eval_config(root: Path) -> list[str]:
    return ["eval", "--config", str(write(root, "eval.yaml", MALFORMED))]


# id -> (the `lkv` arguments, prepared in the case's workspace; patterns its one error line must match)
CASES: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    # damaged artifacts
    "export-garbage-checkpoint": (
        lambda root: ["export", "--ckpt", str(write(root, "x.ckpt", os.urandom(3000))), "--output", "out"],
        [r"checkpoint \S+x\.ckpt: expected a checkpoint written by `lkv fit`, found an unreadable file"],
    ),
    "export-truncated-checkpoint": (
        lambda root: ["export", "--ckpt", str(truncated_checkpoint(root)), "--output", "out"],
        [r"checkpoint \S+cut\.ckpt: expected a checkpoint .* unreadable file \(no zip archive"],
    ),
    "export-missing-checkpoint": (
        lambda root: ["export", "--ckpt", str(root / "none.ckpt"), "--output", "out"],
        [r"checkpoint '\S+none\.ckpt' not found"],
    ),
    "adapter-without-lora-weights": (
        lambda root: adapter_without(root, Path.unlink),
        [r"adapter/adapter_model\.safetensors: not found \(the peft LoRA weights\)"],
    ),
    "adapter-truncated-safetensors": (
        lambda root: adapter_without(root, cut),
        [
            r"adapter/adapter_model\.safetensors: expected a complete safetensors file \(the peft LoRA weights\)"
        ],
    ),
    "adapter-random-safetensors": (
        lambda root: adapter_without(root, lambda path: path.write_bytes(os.urandom(500))),
        [r"adapter_model\.safetensors: expected a complete safetensors file .* found an unreadable one"],
    ),
    "probe-truncated-safetensors": (
        lambda root: [
            "generate",
            "--prompt",
            "alpha",
            "--method",
            "probe",
            "--model",
            str(root / "model"),
            "--probe",
            str(cut(root / "probe" / "probe.safetensors").parent),
        ],
        [r"probe/probe\.safetensors: expected a complete safetensors file \(the probe's weights\)"],
    ),
    # configs
    "fit-missing-config": (
        lambda root: ["fit", "--config", str(root / "none.yaml")],
        [r"--config \S+none\.yaml: no such file"],
    ),
    "fit-unknown-key": (
        lambda root: fit_with(root, num_lookahed=4),
        [r"--config \S+changed\.yaml: ", r"does not accept option 'model\.num_lookahed'", r"lkv fit --help"],
    ),
    "fit-wrong-type": (
        lambda root: fit_with(root, optim={"lr": "fast"}),
        [r"--config \S+changed\.yaml: ", r'"model\.optim\.lr"', r"float", r"fast"],
    ),
    "fit-malformed-yaml": (
        lambda root: ["fit", "--config", str(write(root, "bad.yaml", MALFORMED))],
        [r"bad\.yaml, line 3, column 2: malformed YAML \(expected <block end>"],
    ),
    "fit-zero-lookahead-tokens": (
        lambda root: fit_with(root, num_lookahead=0),
        [r"model\.num_lookahead: expected lookahead tokens ≥ 1, found 0$"],
    ),
    "fit-negative-lr": (
        lambda root: fit_with(root, optim={"lr": -1}),
        [r"model\.optim\.lr: expected a learning rate > 0\.0, found -1\.0$"],
    ),
    "fit-zero-lr": (
        lambda root: fit_with(root, optim={"lr": 0.0}),
        [r"model\.optim\.lr: expected a learning rate > 0\.0, found 0\.0$"],
    ),
    "sweep-unknown-grid-key": (
        lambda root: sweep_with_grid(root, {"model.num_lookahed": [2, 4]}),
        [r"--grid: point num_lookahed=2: Group 'model' does not accept option 'num_lookahed'"],
    ),
    "fit-zero-probe-lr": (
        lambda root: fit_with(root, probe={"optim": {"lr": 0.0}}),
        [r"model\.probe\.optim\.lr: expected a learning rate > 0\.0, found 0\.0$"],
    ),
    "sweep-zero-lr-in-grid": (
        lambda root: sweep_with_grid(root, {"model.optim.lr": [0.01, 0.0]}),
        [r"--grid: point \S+: model\.optim\.lr: expected a learning rate > 0\.0, found 0\.0"],
    ),
    "label-malformed-yaml": (
        lambda root: ["label", "--config", str(write(root, "label.yaml", MALFORMED))],
        [r"label\.yaml, line 3, column 2: malformed YAML"],
    ),
    "eval-malformed-yaml": (eval_config, [r"eval\.yaml, line 3, column 2: malformed YAML"]),
    "eval-binary-config": (
        lambda root: ["eval", "--config", str(write(root, "eval.yaml", BINARY))],
        [r"--config \S+eval\.yaml: expected UTF-8 text, found the byte 0x8c"],
    ),
    # prompt files
    "generate-binary-prompt-file": (
        lambda root: ["generate", "--prompt_file", str(write(root, "prompt.txt", BINARY))],
        [r"--prompt_file \S+prompt\.txt: expected UTF-8 text, found the byte 0x8c"],
    ),
    "label-binary-prompt-file": (
        lambda root: label_args(root, root / "labels", write(root, "p.jsonl", BINARY)),
        [r"prompt file \S+p\.jsonl: expected UTF-8 text, found the byte 0x8c"],
    ),
    "label-into-an-adapter-folder": (
        lambda root: label_args(root, root / "adapter", root / "prompts.jsonl"),
        [r"--output \S+adapter: expected a new or empty folder or a label folder", r"adapter_config\.json"],
    ),
    # bench settings
    "bench-negative-length": (
        lambda root: ["bench", "--lengths", "[-5]"],
        [r"--lengths: expected prompt lengths of at least 1 token, found \[-5\]"],
    ),
    "bench-zero-repeats": (
        lambda root: ["bench", "--repeats", "0"],
        [r"--repeats: expected a whole number ≥ 1, found 0"],
    ),
    # already one line before issue 53
    "generate-zero-budget": (
        lambda root: ["generate", "--prompt", "alpha", "--budget", "0"],
        [r"--budget: budget must be ≥ 1 token per head, got 0"],
    ),
    "label-zero-response-tokens": (
        lambda root: label_args(root, root / "labels", root / "prompts.jsonl", response_tokens=0),
        [r"--response_tokens: expected a positive number, found 0"],
    ),
    # more settings of every verb
    "sweep-missing-base": (
        lambda root: ["sweep", "--base", str(root / "none.yaml"), "--grid", "{model.num_lookahead: [2]}"],
        [r"sweep base config '\S+none\.yaml' not found"],
    ),
    "sweep-eval-key-without-eval-config": (
        lambda root: sweep_with_grid(root, {"eval.budgets": [[4]]}),
        [r"grid keys \['eval\.budgets'\] need an eval_config"],
    ),
    "sweep-bad-launcher-field": (
        lambda root: [*sweep_with_grid(root, {"model.num_lookahead": [2]}), "--launcher", "{gpus: 2}"],
        [r"launcher", r"gpus"],
    ),
    "eval-unknown-method": (
        lambda root: ["eval", "--tasks", "[]", "--methods", "[snapkv, nosuch]"],
        [r"methods", r"nosuch"],
    ),
    "eval-unknown-task-class": (
        lambda root: ["eval", "--tasks", "[{class_path: lkv.eval.tasks.NoSuchTask}]"],
        [r'"tasks"', r"NoSuchTask"],
    ),
    "eval-press-args-of-an-unknown-method": (
        lambda root: [
            "eval",
            "--tasks",
            "[]",
            "--methods",
            "[snapkv]",
            "--press_args",
            "{nosuch: {window: 4}}",
        ],
        [r"press_args", r"nosuch"],
    ),
    "eval-unknown-head-budget": (
        lambda root: ["eval", "--tasks", "[]", "--head_budget", "sideways"],
        [r'"head_budget"', r"sideways"],
    ),
    "generate-missing-prompt-file": (
        lambda root: ["generate", "--prompt_file", str(root / "none.txt")],
        [r"none\.txt"],
    ),
    "generate-missing-adapter-folder": (
        lambda root: [
            "generate",
            "--prompt",
            "alpha",
            "--method",
            "lookaheadkv",
            "--adapter",
            str(root / "none"),
        ],
        [r"\S+none"],
    ),
    "generate-unknown-truncate-policy": (
        lambda root: ["generate", "--prompt", "alpha", "--truncate", "sideways"],
        [r'"truncate"', r"sideways"],
    ),
    "generate-missing-model-folder": (
        lambda root: ["generate", "--prompt", "alpha", "--model", str(root / "none")],
        [r"\S+none"],
    ),
    "label-unknown-prompt-source": (
        lambda root: ["label", "--output", str(root / "labels"), "--prompts", "NoSuchPrompts"],
        [r'"prompts"', r"NoSuchPrompts"],
    ),
    "fit-missing-label-folder": (
        lambda root: ["fit", "--config", str(root / "fit.yaml"), "--data.train", str(root / "none")],
        [r"\S+none"],
    ),
    "bench-unknown-benchmark": (
        lambda root: ["bench", "--which", "[nosuch]"],
        [r"--which", r"nosuch"],
    ),
    "eval-unknown-option": (
        lambda root: ["eval", "--tasks", "[]", "--budgetz", "4"],
        [r"unrecognized arguments: --budgetz"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line(case, workspace, tmp_path, monkeypatch, capsys):
    root = tmp_path / "case"
    shutil.copytree(workspace, root)
    monkeypatch.chdir(root)
    prepare, patterns = CASES[case]
    args = prepare(root)
    with pytest.raises(SystemExit) as exit_:
        lkv_main(args)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"lkv {args[0]}: error: "), err
    for pattern in patterns:
        assert re.search(pattern, errors[0]), f"{pattern!r} not in {errors[0]!r}"


def test_a_fit_that_fails_before_training_leaves_no_run_folder(workspace, tmp_path, monkeypatch, capsys):
    """The labels are of another model: the fit fails in its setup, after TensorBoard's version folder was
    made for it; the folder goes with the failure."""
    root = tmp_path / "case"
    shutil.copytree(workspace, root)
    qwen, tokenizer = build_tiny_model("qwen")
    qwen.save_pretrained(root / "qwen")
    tokenizer.save_pretrained(root / "qwen")
    settings = yaml.safe_load((root / "fit.yaml").read_text())
    settings["model"]["model"] = str(root / "qwen")
    settings["trainer"]["logger"] = {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": str(root / "tb")},
    }
    (root / "qwen.yaml").write_text(yaml.safe_dump(settings))
    (root / "tb" / "lightning_logs" / "version_0").mkdir(parents=True)  # an earlier run's: kept
    with pytest.raises(SystemExit):
        lkv_main(["fit", "--config", str(root / "qwen.yaml")])
    assert "made by model" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "tb" / "lightning_logs").iterdir()) == ["version_0"]
