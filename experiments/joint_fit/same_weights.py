"""Does one joint fit train the same weights as the two fits it replaces, on the real model?

From the joint config, the three `lkv fit` configs of scripts/bench_joint_fit.py (the module alone, the probe alone,
both; same labels, seed and steps), each run to ``--steps`` with a last checkpoint; then every weight of the module
alone's checkpoint is compared with the same weight of the joint checkpoint, and every weight of the probe alone's
with the joint one's. Equal bit for bit means the joint folder is the two-run pair: every kept position and row of
an evaluation is the same, on any needle set.

    OMP_NUM_THREADS=1 python experiments/joint_fit/same_weights.py --config configs/long_smollm2.yaml \\
        --train data/labels/joint_bench_3k/train --steps 8 --output experiments/joint_fit/same_weights.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_joint_fit", ROOT / "scripts" / "bench_joint_fit.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The trained weights a checkpoint holds (``state_dict``: the trainable parameters only)."""
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


def compare(alone: dict[str, torch.Tensor], joint: dict[str, torch.Tensor]) -> dict[str, object]:
    """Per weight of ``alone``: bit-equal to ``joint``'s, else the largest absolute difference."""
    missing = sorted(set(alone) - set(joint))
    differ = {
        name: float((alone[name].float() - joint[name].float()).abs().max())
        for name in alone
        if name in joint and not torch.equal(alone[name], joint[name])
    }
    return {"weights": len(alone), "missing_in_joint": missing, "differ": differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    joint = yaml.safe_load(Path(args.config).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoints = {}
        for kind, config in bench.run_configs(joint, args.train, args.steps, root).items():
            folder = root / kind
            config["trainer"]["enable_checkpointing"] = True
            config["trainer"]["callbacks"] = [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": str(folder), "save_last": True},
                }
            ]
            path = root / f"{kind}.yaml"
            path.write_text(yaml.safe_dump(config))
            bench.run_fit(path)
            checkpoints[kind] = weights(folder / "last.ckpt")
        result = {
            "command": f"python experiments/joint_fit/same_weights.py --config {args.config} --train {args.train} "
            f"--steps {args.steps} --output {args.output}",
            "steps": args.steps,
            "module_vs_joint": compare(checkpoints["module"], checkpoints["joint"]),
            "probe_vs_joint": compare(checkpoints["probe"], checkpoints["joint"]),
            "joint_weights": len(checkpoints["joint"]),
        }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=2)[:3000])


if __name__ == "__main__":
    main()
