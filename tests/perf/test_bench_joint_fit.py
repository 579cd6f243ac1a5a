"""scripts/bench_joint_fit.py: the three fits it times (module alone, probe alone, both in one) are valid `lkv fit`
configs with the joint config's settings, over the same labels and steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from lkv.train.cli import resolved_fit_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_joint_fit.py"
spec = importlib.util.spec_from_file_location("bench_joint_fit", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_three_fits_share_labels_steps_and_settings(tmp_path):
    joint = yaml.safe_load((ROOT / "configs" / "long_smollm2.yaml").read_text())
    configs = bench.run_configs(joint, "labels/train", 7, tmp_path)
    resolved = {}
    for kind, config in configs.items():
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(config))
        resolved[kind] = resolved_fit_config(path)
        assert (
            resolved[kind]["trainer"]["max_steps"] == 7 and resolved[kind]["data"]["train"] == "labels/train"
        )
        assert resolved[kind]["trainer"]["limit_val_batches"] == 0
    module, probe, both = resolved["module"]["model"], resolved["probe"]["model"], resolved["joint"]["model"]
    assert module["probe"] is None and {**module, "probe": both["probe"]} == both
    assert probe["class_path"] == "lkv.train.probe_module.ProbeModule"
    settings = probe["init_args"]
    assert settings["optim"] == both["probe"]["optim"] and settings["optim"]["lr"] == 5e-3
    assert (settings["hidden_dim"], settings["target"], settings["seed"]) == (512, "labels", 0)
    assert all(settings[key] == both[key] for key in bench.SHARED)


def test_a_config_without_a_probe_is_refused(tmp_path):
    plain = yaml.safe_load((ROOT / "configs" / "smollm2_135m.yaml").read_text())
    with pytest.raises(ValueError, match=r"model\.probe: expected the probe settings of a joint fit"):
        bench.run_configs(plain, "labels/train", 7, tmp_path)
