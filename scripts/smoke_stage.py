"""One stage of scripts/smoke_gpu.sh: ``lkv ARGS...`` in this process, then its seconds and peak memory.

    python scripts/smoke_stage.py --out DIR NAME -- LKV ARGS...
    python scripts/smoke_stage.py --out DIR NAME -- smoke SUBCOMMAND ARGS...    # python -m lkv.perf.smoke

In-process so that CUDA's ``max_memory_allocated`` covers the stage (a subprocess's would be lost); the
record is appended to ``DIR/stages.jsonl`` by :func:`lkv.perf.smoke.record_stage`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lkv.cli import main
from lkv.core.clock import clock
from lkv.perf import smoke


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("name")
    parser.add_argument("lkv_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    lkv_args = args.lkv_args[1:] if args.lkv_args[:1] == ["--"] else args.lkv_args
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    start = clock(device)
    if lkv_args[:1] == ["smoke"]:  # the smoke run's own helpers (model, prompts, essays)
        smoke.main(lkv_args[1:])
    else:
        main(lkv_args)
    smoke.record_stage(args.name, args.out, lkv_args, clock(device) - start)


if __name__ == "__main__":
    run()
