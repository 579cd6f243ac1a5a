"""Every eval suite (configs/eval and the studies' under experiments/<study>/configs) and the demo config parse
with their verbs' parsers (no weights loaded), and `lkv demo` runs its stages in order, reuses what earlier
runs left and writes the timing table into the report."""

import functools
import json
import shutil
from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

import lkv.commands.demo
import lkv.commands.eval
import lkv.commands.export
import lkv.commands.label
import lkv.eval.runner
import lkv.eviction.presses.lookaheadkv
import lkv.model.assets
import lkv.train.cli
import lkv.train.module
from lkv.cli import main as lkv_main
from lkv.commands.demo import demo, eval_arguments, fit_config
from lkv.eval.tasks import Benchmark, ImportanceTask
from tests.shipped_configs import ROOT, is_fit_config, shipped_configs

EVAL_CONFIGS = [
    p
    for p in shipped_configs()
    if p.parent == ROOT / "configs" / "eval"
    or (p.is_relative_to(ROOT / "experiments") and not is_fit_config(p))
]
DEMO_CONFIG = ROOT / "configs" / "demo" / "smollm2_135m.yaml"


def header_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("#")]


def test_the_suites_are_found():
    names = {p.stem for p in EVAL_CONFIGS}
    assert {"default", "niah", "ruler", "code", "fidelity", "importance", "longbench"} <= names
    assert {"full_evidence", "reach_far", "trained_distractors"} <= names  # the studies' evals


@pytest.mark.parametrize("path", EVAL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_eval_config_parses_and_builds_its_tasks(path, capsys):
    relative = path.relative_to(ROOT)
    assert any(f"lkv eval --config {relative}" in line for line in header_lines(path)), "no exact command"
    assert any("Hardware" in line for line in header_lines(path)), "no Hardware line"
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["eval", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["tasks"] and printed["methods"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(lkv.commands.eval.evaluate)
    built = parser.instantiate(parser.parse_args(["--config", str(path)]))
    assert all(isinstance(task, Benchmark) for task in built.tasks)
    assert len(built.tasks) == len(yaml.safe_load(path.read_text())["tasks"])


def test_demo_config_parses(capsys):
    relative = DEMO_CONFIG.relative_to(ROOT)
    assert any(f"lkv demo --config {relative}" in line for line in header_lines(DEMO_CONFIG))
    assert any("Hardware" in line for line in header_lines(DEMO_CONFIG))
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["demo", "--config", str(DEMO_CONFIG), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (ROOT / printed["eval_config"]).is_file() and (ROOT / printed["train_config"]).is_file()
    assert "demo" in (ROOT / "Makefile").read_text() and str(relative) in (ROOT / "Makefile").read_text()


def test_the_demo_suite_is_a_part_of_the_full_suite_and_names_it():
    """`make demo` runs configs/eval/demo.yaml; every row it computes is one of configs/eval/default.yaml's
    (the same tasks and settings, fewer methods, budgets, settings and importance labels), and it says where
    the full suite is."""
    demo_suite = ROOT / yaml.safe_load(DEMO_CONFIG.read_text())["eval_config"]
    assert demo_suite == ROOT / "configs" / "eval" / "demo.yaml"
    assert any("configs/eval/default.yaml" in line for line in header_lines(demo_suite))
    small, full = (
        yaml.safe_load(p.read_text()) for p in (demo_suite, ROOT / "configs" / "eval" / "default.yaml")
    )
    for key in ("methods", "budgets", "settings"):
        assert set(small[key]) <= set(full[key]), key
    assert len(small["methods"]) < len(full["methods"]) and len(small["budgets"]) < len(full["budgets"])
    assert {"fullkv", "lookaheadkv", "snapkv", "streamingllm"} <= set(small["methods"])
    for task in small["tasks"]:  # an importance task may take only the first of the same labels
        first = {**task, "init_args": {k: v for k, v in task["init_args"].items() if k != "max_samples"}}
        assert first in full["tasks"], task


def test_fit_config_redirects_the_recipe_and_still_parses(tmp_path, monkeypatch, capsys):
    config = fit_config("configs/smollm2_135m.yaml", tmp_path / "labels", tmp_path / "out", max_epochs=2)
    assert config["data"]["train"] == str(tmp_path / "labels" / "train")
    assert config["data"]["val"] == str(tmp_path / "labels" / "heldout")
    assert config["trainer"]["max_epochs"] == 2
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == str(tmp_path / "out" / "tensorboard")
    (checkpoint,) = [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    assert checkpoint["init_args"]["dirpath"] == str(tmp_path / "out" / "fit" / "checkpoints")
    recipe = yaml.safe_load((ROOT / "configs" / "smollm2_135m.yaml").read_text())
    assert config["model"] == recipe["model"]  # the method's settings are the recipe's
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(
        lkv.train.module, "load_backbone", lambda *a, **k: pytest.fail("parsing loaded a model")
    )
    with pytest.raises(SystemExit) as exit_info:
        lkv.train.cli.lightning_main(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["max_epochs"] == 2


def test_eval_arguments_point_the_importance_task_at_the_demo_labels(tmp_path):
    arguments = eval_arguments(
        str(ROOT / "configs" / "eval" / "default.yaml"),
        tmp_path,
        tmp_path / "adapter",
        tmp_path / "held",
        "t",
    )
    (importance,) = [t for t in arguments["tasks"] if isinstance(t, ImportanceTask)]
    assert importance.folder == str(tmp_path / "held")
    assert arguments["output"] == str(tmp_path) and arguments["adapter"] == str(tmp_path / "adapter")
    assert "lookaheadkv" in arguments["methods"] and {64, 128} <= set(arguments["budgets"])


def test_demo_runs_the_stages_and_reuses_earlier_work(tmp_path, monkeypatch, capsys):
    calls: list[str] = []
    modes: list[str] = []
    out = tmp_path / "report"

    def fake_label(output, prompts, **kwargs):
        calls.append(f"label {prompts.split} {prompts.num_prompts}")
        modes.append(kwargs["label_mode"])
        return "labelled"

    def fake_fit(args):
        calls.append("fit" if len(args) == 3 else f"fit resumed from {Path(args[4]).name}")
        config = yaml.safe_load(Path(args[2]).read_text())
        folder = Path(config["trainer"]["callbacks"][0]["init_args"]["dirpath"])
        folder.mkdir(parents=True, exist_ok=len(args) > 3)
        (folder / "last.ckpt").write_text("weights")

    def fake_export(ckpt, output):
        calls.append(f"export {Path(ckpt).name}")
        Path(output).mkdir(parents=True, exist_ok=True)

    @functools.wraps(lkv.commands.eval.evaluate)  # the demo parses its suite with evaluate's signature
    def fake_evaluate(**arguments):
        calls.append("eval")
        row = {"task": "niah", "sample": "s", "method": "snapkv", "budget": "64", "setting": "aware"}
        row |= {"score": 1.0, "metrics": {"string_match": 1.0}, "meta": {"length": 8, "depth": 0.5}}
        with (Path(arguments["output"]) / "results.jsonl").open("a") as file:
            file.write(json.dumps(row) + "\n")
        return "evaluated"

    monkeypatch.setattr(lkv.model.assets, "fetch_all", lambda: calls.append("assets"))
    monkeypatch.setattr(lkv.commands.label, "label", fake_label)
    monkeypatch.setattr(lkv.train.cli, "lightning_main", fake_fit)
    monkeypatch.setattr(lkv.commands.export, "export", fake_export)
    monkeypatch.setattr(lkv.commands.eval, "evaluate", fake_evaluate)
    monkeypatch.setattr(
        lkv.commands.demo,
        "cache_length_section",
        lambda *a: calls.append("trace") or ["## Cache length (fake)"],
    )
    settings = {
        "output": str(out),
        "labels": str(tmp_path / "labels"),
        "train_prompts": 3,
        "heldout_prompts": 2,
        "eval_config": str(ROOT / "configs" / "eval" / "default.yaml"),
        "train_config": str(ROOT / "configs" / "smollm2_135m.yaml"),
        "progress": False,
    }
    demo(**settings)
    assert calls == ["assets", "label train 3", "label heldout 2", "fit", "export last.ckpt", "eval", "trace"]
    report = (out / "report.md").read_text()
    assert "| fit (" in report and "| **total** |" in report and "**niah**, question-aware" in report
    assert "| stage | wall time | CPU time |" in report
    assert "## Cache length (fake)" in report
    assert (out / "fit.yaml").is_file() and (out / "plots" / "niah_aware.png").is_file()

    calls.clear()
    demo(**settings)  # the adapter exists: no training, results resume
    assert calls == ["assets", "label train 3", "label heldout 2", "eval", "trace"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 2

    calls.clear()
    demo(**settings, refit=True)  # a new adapter: the old results go
    assert calls == ["assets", "label train 3", "label heldout 2", "fit", "export last.ckpt", "eval", "trace"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    assert set(modes) == {"aware"}

    calls.clear()
    shutil.rmtree(out / "adapter")  # a fit stopped before its export: the same recipe resumes it
    demo(**settings)
    assert calls[3:5] == ["fit resumed from last.ckpt", "export last.ckpt"]
    calls.clear()
    # ... but another recipe starts over (the fake fit refuses a leftover folder)
    shutil.rmtree(out / "adapter")
    demo(**settings, max_epochs=7)
    assert calls[3:5] == ["fit", "export last.ckpt"]

    demo(**settings, label_mode="agnostic")  # question-agnostic labels reach both label runs
    assert modes[-2:] == ["agnostic", "agnostic"]


def test_a_cache_length_trace_is_reused_only_at_its_own_length(tmp_path, monkeypatch):
    class Loaded(Exception):
        pass

    def load(_adapter):
        raise Loaded

    monkeypatch.setattr(lkv.eviction.presses.lookaheadkv, "load_lookahead", load)
    (tmp_path / "cache_lengths.json").write_text(
        json.dumps({"fullkv": [100, 101, 102], "quest": [100, 101, 102]})
    )
    lines = lkv.commands.demo.cache_length_section(tmp_path / "adapter", tmp_path, 2, 3, False)
    assert "| fullkv | 100 | 102 | 102 |" in lines and (tmp_path / "plots" / "cache_length.png").is_file()
    with pytest.raises(Loaded):  # a trace of another length is made again
        lkv.commands.demo.cache_length_section(tmp_path / "adapter", tmp_path, 2, 4, False)
