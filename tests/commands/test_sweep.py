"""`lkv sweep` on a tiny model saved to disk: a 2×2 grid of real `lkv fit` subprocesses (+ timing + eval),
the summary table and plots, and a rerun that fits nothing again."""

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lkv.sweep.points
from lkv.cli import main as lkv_main
from lkv.eval.report import write_report
from lkv.eval.results import NO_BUDGET, ResultsFile
from lkv.eval.stats import bootstrap_interval
from lkv.sweep.grid import grid_points, point_name
from lkv.sweep.launch import check_points_fit, parse_launcher
from lkv.sweep.points import eval_scores, fit_values, point_config, set_key
from lkv.train.cli import resolved_fit_config
from tests.tensorboard_events import curve, hparams_plugin_data, points_per_step, scalars

ROOT = Path(__file__).resolve().parents[2]


def test_grid_runs_every_point_then_a_rerun_skips_them(tiny_setup, tmp_path, monkeypatch, capsys):
    fits = []
    real_run = subprocess.run

    def counting_run(command, **kwargs):
        if command[1:4] == ["-m", "lkv.cli", "fit"]:  # not other tools' subprocesses (config parsing)
            fits.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr(lkv.sweep.points.subprocess, "run", counting_run)
    out, summary = tmp_path / "sweep", tmp_path / "summary"
    evaluation = yaml.safe_load(tiny_setup["eval"].read_text()) | {"methods": ["lookaheadkv", "snapkv"]}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(evaluation))
    config = {
        "base": str(tiny_setup["fit"]),
        "output": str(out),
        "summary_dir": str(summary),
        "eval_config": str(tmp_path / "eval.yaml"),
        "overrides": {"model.optim.lr": 0.01},
        "grid": {"model.num_lookahead": [2, 4], "model.lora_targets": ["none", ["q_proj", "v_proj"]]},
        "score": "val/recall@4",
        "overhead_tokens": 16,
        "overhead_repeats": 1,
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    lkv_main(["sweep", "--config", str(tmp_path / "sweep.yaml")])
    printed = capsys.readouterr().out
    assert len(fits) == 4 and "4 run now, 0 already done" in printed
    # the adapter-free baseline ran once, in the first point; the others copied its rows (timings included)
    assert printed.count("2 rows of methods without an adapter copied from") == 3
    evals = [p / "eval" / "results.jsonl" for p in sorted(out.glob("points/*"))]
    copied = [
        [r for r in map(json.loads, e.read_text().splitlines()) if r["method"] == "snapkv"] for e in evals
    ]
    assert len(copied[0]) == 2 and all(c == copied[0] for c in copied)

    rows = list(csv.DictReader((summary / "summary.csv").open()))
    assert [(r["model.num_lookahead"], r["model.lora_targets"]) for r in rows] == [
        ("2", "none"),
        ("2", "q_proj+v_proj"),
        ("4", "none"),
        ("4", "q_proj+v_proj"),
    ]
    for row in rows:
        assert 0 <= float(row["val/recall@4"]) <= 1 and float(row["overhead"]) > 0
        # the point's eval ran on its own checkpoint: importance recall of the same 2 held-out prompts
        assert 0 <= float(row["eval/importance/recall@4"]) <= 1
    point = out / "points" / "num_lookahead=4,lora_targets=q_proj+v_proj"
    ran = yaml.safe_load((point / "config.yaml").read_text())
    assert ran["model"]["num_lookahead"] == 4 and ran["model"]["lora_targets"] == ["q_proj", "v_proj"]
    assert ran["model"]["optim"]["lr"] == 0.01
    assert ran["trainer"]["callbacks"][0]["init_args"]["dirpath"] == str(point / "checkpoints")
    # every point has its own TensorBoard run, whose HParams session holds the point's grid values and
    # names its fit, eval and cost results, which the run holds as scalars
    events = EventAccumulator(str(out / "tensorboard" / point.name / "fit")).Reload()
    metrics, params = hparams_plugin_data(events)
    assert params == {"model.num_lookahead": 4, "model.lora_targets": "q_proj+v_proj"}
    assert metrics[0] == "val/recall@4"
    assert {"val/kendall_tau", "val/kl", "eval/importance/recall@4", "cost/overhead", "cost/fit_s"} <= set(
        metrics
    )
    assert set(metrics) <= set(scalars(events))
    assert curve(events, "eval/importance/recall@4") == [
        (0, pytest.approx(float(rows[-1]["eval/importance/recall@4"]), rel=1e-5))
    ]
    # the fit's last logged recall is the one the summary reports
    result = json.loads((point / "result.json").read_text())
    assert float(rows[-1]["val/recall@4"]) == pytest.approx(result["metrics"]["val/recall@4"], rel=1e-5)
    # eval scores carry their interval and n (2 held-out prompts), the table shows them in brackets
    recall = [float(rows[-1][f"eval/importance/recall@4{part}"]) for part in ("_low", "", "_high")]
    assert recall == sorted(recall) and rows[-1]["eval/importance/recall@4_n"] == "2"
    assert result["intervals"]["eval/importance/recall@4"][2] == 2
    table = (summary / "summary.md").read_text()
    assert "| none | " in table and "| q_proj+v_proj | " in table
    assert f"{recall[1]:.3f} [{recall[0]:.3f}, {recall[2]:.3f}]" in table and "recall@4_low" not in table
    assert {p.name for p in (summary / "plots").iterdir()} == {"score_vs_size.png", "overhead_vs_size.png"}

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("points/*/checkpoints/last.ckpt")}
    lkv_main(["sweep", "--config", str(tmp_path / "sweep.yaml")])
    assert len(fits) == 4 and "0 run now, 4 already done" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.glob("points/*/checkpoints/last.ckpt")} == mtimes
    # the rerun rewrote the sessions: still one point per (run, tag, step)
    counts = points_per_step(out / "tensorboard")
    assert counts and {key: n for key, n in counts.items() if n != 1} == {}


def test_eval_scores_carry_the_eval_reports_intervals(tmp_path):
    def row(task, sample, method, budget, score, metrics=None):
        keys = {"task": task, "sample": sample, "method": method, "budget": budget, "setting": "aware"}
        return keys | {"score": score, "metrics": metrics or {"string_match": score}, "meta": {"depth": 0.5}}

    rows = [row("niah", f"s{i}", "lookaheadkv", "64", float(i % 3 > 0)) for i in range(12)]
    rows += [row("niah", f"s{i}", "snapkv", "64", 0.0) for i in range(12)]  # another method: not counted
    recalls = [0.5, 0.7, 0.9, 0.6]
    rows += [
        row("importance", f"p{i}", "lookaheadkv", NO_BUDGET, r, {"recall@64": r, "kendall_tau": r / 2})
        for i, r in enumerate(recalls)
    ]
    results = ResultsFile(tmp_path / "results.jsonl")
    for r in rows:
        results.add(r)
    write_report(rows, tmp_path)
    scores, intervals = eval_scores(tmp_path)
    with (tmp_path / "summary.csv").open() as handle:
        cell = next(r for r in csv.DictReader(handle) if r["method"] == "lookaheadkv" and r["task"] == "niah")
    assert scores["eval/niah/aware@64"] == pytest.approx(8 / 12)
    assert intervals["eval/niah/aware@64"] == pytest.approx(
        [float(cell["ci_low"]), float(cell["ci_high"]), 12], rel=1e-5
    )  # the Wilson interval of the eval's own summary
    assert scores["eval/importance/recall@64"] == pytest.approx(0.675)
    assert intervals["eval/importance/recall@64"] == [*bootstrap_interval(recalls), 4]
    assert intervals["eval/importance/kendall_tau"][:2] == list(bootstrap_interval([r / 2 for r in recalls]))


def test_grid_and_keys():
    assert grid_points({"a": [1, 2], "b.c": ["x", ["y", "z"]]}) == [
        {"a": 1, "b.c": "x"},
        {"a": 1, "b.c": ["y", "z"]},
        {"a": 2, "b.c": "x"},
        {"a": 2, "b.c": ["y", "z"]},
    ]
    assert point_name({"model.num_lookahead": 8, "model.lora_targets": ["q_proj", "v_proj"]}) == (
        "num_lookahead=8,lora_targets=q_proj+v_proj"
    )
    config = {"trainer": {"callbacks": [{"init_args": {"x": 1}}]}, "model": {}}
    set_key(config, "trainer.callbacks.0.init_args.x", 2)
    set_key(config, "model.new.deep", 3)
    assert config == {"trainer": {"callbacks": [{"init_args": {"x": 2}}]}, "model": {"new": {"deep": 3}}}
    with pytest.raises(KeyError, match=r"'trainer.callbacks.5' is not a section"):
        set_key(config, "trainer.callbacks.5.init_args", 1)
    with pytest.raises(ValueError, match=r"grid.model.num_lookahead: expected a non-empty list .* found 4"):
        grid_points({"model.num_lookahead": 4})


def test_point_config_redirects_checkpoints_and_logs(tmp_path):
    checkpoint = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "m"}}
    base = {"model": {"lr": 1}, "trainer": {"callbacks": [checkpoint]}}
    config = point_config(base, {"model.lr": 2}, tmp_path / "p", tmp_path / "tb" / "p")
    assert config["model"]["lr"] == 2 and base["model"]["lr"] == 1  # the base is not modified
    dirpath = str(tmp_path / "p" / "checkpoints")
    assert config["trainer"]["callbacks"] == [
        {**checkpoint, "init_args": {"monitor": "m", "dirpath": dirpath, "save_last": True}}
    ]
    logger = {"save_dir": str(tmp_path / "tb"), "name": "p", "version": "fit", "default_hp_metric": False}
    assert config["trainer"]["logger"]["init_args"] == logger
    assert config["trainer"]["enable_autolog_hparams"] is False  # the sweep writes the HParams session


def test_point_config_refuses_a_non_tensorboard_logger(tmp_path):
    base = {"model": {}, "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger"}}}
    with pytest.raises(ValueError, match="trainer.logger: a sweep needs one TensorBoardLogger, found"):
        point_config(base, {}, tmp_path, tmp_path / "tb")


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweep_configs_parse_and_their_keys_exist(path, capsys):
    relative = path.relative_to(ROOT)
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"lkv sweep --config {relative}" in line for line in header), f"{relative}: no command"
    assert any("Hardware" in line for line in header), f"{relative}: no Hardware line"
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["sweep", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    base = resolved_fit_config(ROOT / config["base"])
    for key in [*config.get("overrides", {}), *config["grid"]]:
        if not key.startswith("eval."):
            node = base
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, (
                    f"{relative}: {key} is no key of {config['base']}"
                )
                node = node[part]
    assert len(grid_points(config["grid"])) >= 4
    if config.get("launcher") is not None:  # the job resources fit the points' trainer (one rank per task)
        launcher = parse_launcher(config["launcher"])
        fits = {
            point_name(values): point_config(
                base,
                {**config.get("overrides", {}), **fit_values(values)},
                Path("p"),
                Path("tb"),
            )
            for values in grid_points(config["grid"])
        }
        check_points_fit(launcher, fits)
        assert any("--summarize true" in line for line in header), f"{relative}: no summarize command"


def is_fit(pid: str) -> bool:
    try:
        return b"\0fit\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has already exited
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
def test_sigterm_also_stops_the_running_fit(tiny_setup, tmp_path):
    """A pre-empted sweep must not leave its `lkv fit` child writing into the point folder."""
    config = {
        "base": str(tiny_setup["fit"]),
        "output": str(tmp_path / "sweep"),
        "grid": {"model.num_lookahead": [2]},
        "overhead_tokens": 0,
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "lkv.cli", "sweep", "--config", str(tmp_path / "sweep.yaml")]
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children_file = Path(f"/proc/{sweep.pid}/task/{sweep.pid}/children")
    children: list[str] = []
    deadline = time.monotonic() + 120
    while not children and sweep.poll() is None and time.monotonic() < deadline:
        # the fit, not other short-lived children (jsonargparse asks a python for its sys.path)
        children = [c for c in children_file.read_text().split() if is_fit(c)]
        time.sleep(0.05)
    assert children, "the sweep never started its fit"
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) == 128 + signal.SIGTERM
    assert not Path(f"/proc/{children[0]}").exists(), "the fit outlived its sweep"
