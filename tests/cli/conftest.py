"""Whole-command tests compare in-process runs with `lkv` subprocesses, which run one thread each
(`OMP_NUM_THREADS=1`, see `subprocess_env`). The in-process side runs one thread too, so both reduce in the
same order: with the machine's default thread count, losses drifted past rel 1e-4 within three steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from lkv.core.generation import eos_ids
from lkv.labels.dataset_prompts import JsonlPrompts
from lkv.labels.labeller import label_prompt
from lkv.labels.prompts import render_prompt
from lkv.labels.shards import load_labels, read_meta, row_scores, shard_files
from lkv.model.backbone import load_backbone
from tests.conftest import build_tiny_model, make_label_folder


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


REPO = Path(__file__).resolve().parents[2]


WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


RESPONSE_TOKENS = 5


MAX_PROMPT_TOKENS = 256


def write_prompts(path: Path, num: int) -> Path:
    lines = [
        {"id": f"q{i}", "prompt": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(10 + 3 * i))}
        for i in range(num)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def make_workspace(root: Path) -> Path:
    """``model/`` (the tiny Llama saved as a HF folder), ``prompts.jsonl`` (8 prompts), ``train/`` (6 labels)."""
    model, tokenizer = build_tiny_model("llama")
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    write_prompts(root / "prompts.jsonl", 8)
    make_label_folder(model, tokenizer, root / "train", num=6)
    return root


def lkv_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lkv.cli", *args]


def subprocess_env() -> dict[str, str]:
    # The repository root on the path lets configs name this file's RecordLosses callback.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def start_lkv(args: list[str], cwd: Path, log: IO[str] | None = None) -> subprocess.Popen:
    """Start ``lkv ARGS`` in a process group of its own (Lightning's other ranks join it) with Ctrl-C's default
    handling, its stdout and stderr merged into one text pipe, or into ``log`` (an open file: a test that polls
    the process while it runs, and never reads the pipe, cannot block it on a full pipe); the caller waits for
    it (``communicate`` or ``wait``)."""
    return subprocess.Popen(
        lkv_command(*args),
        cwd=cwd,
        env=subprocess_env(),
        stdout=subprocess.PIPE if log is None else log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # a shell's background job (CI, nohup) ignores SIGINT, and Python then installs no Ctrl-C handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def run_lkv(args: list[str], cwd: Path, timeout: float = 300) -> str:
    """Run ``lkv ARGS`` to completion (:func:`start_lkv`) and return its output; fail the test on a non-zero
    exit or when it runs past ``timeout`` seconds (a hang: the whole process group, DDP ranks included, is
    killed)."""
    process = start_lkv(args, cwd)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"`lkv {' '.join(args)}` still ran after {timeout:.0f} s (a hang):\n{output[-4000:]}")
    assert process.returncode == 0, f"`lkv {' '.join(args)}` exited {process.returncode}:\n{output[-4000:]}"
    return output


def label_args(root: Path, output: Path, prompts: Path, **options: object) -> list[str]:
    settings = {
        "output": output,
        "model": root / "model",
        "response_tokens": RESPONSE_TOKENS,
        "max_prompt_tokens": MAX_PROMPT_TOKENS,
        "score_dtype": "float32",
        "shard_size": 1,
        "accelerator": "cpu",
        "progress": "false",
        "prompts.class_path": "lkv.labels.dataset_prompts.JsonlPrompts",
        "prompts.init_args.path": prompts,
        "prompts.init_args.id_field": "id",
        **options,
    }
    return ["label", *(f"--{key}={value}" for key, value in settings.items())]


def fit_settings(
    root: Path, run: Path, max_steps: int, batch_size: int = 1, accumulate: int = 1, shuffle: bool = False
) -> dict:
    """A fit config for the tiny model: checkpoint after every step into ``run``, record every batch's loss."""
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "default_root_dir": str(run),
            "max_steps": max_steps,
            "accumulate_grad_batches": accumulate,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": False,
            "callbacks": [
                {
                    "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {
                        "dirpath": str(run / "checkpoints"),
                        "save_last": True,
                        "every_n_train_steps": 1,
                    },
                },
                {"class_path": "tests.cli.test_distributed.RecordLosses", "init_args": {"folder": str(run)}},
            ],
        },
        "model": {
            "model": str(root / "model"),
            "num_lookahead": 4,
            "optim": {"lr": 1e-2},
            "snapkv_window": 8,
            "snapkv_kernel": 3,
            "eval_budgets": [4, 8],
        },
        "data": {"train": str(root / "train"), "batch_size": batch_size, "shuffle": shuffle},
    }


def fit_config(root: Path, run: Path, max_steps: int, **options) -> Path:
    """:func:`fit_settings` written to ``run/fit.yaml``."""
    run.mkdir(parents=True, exist_ok=True)
    path = run / "fit.yaml"
    path.write_text(yaml.safe_dump(fit_settings(root, run, max_steps, **options)))
    return path


def read_losses(folder: Path, name: str = "losses") -> dict[int, list[dict]]:
    """``rank -> records`` written by :class:`RecordLosses` (or ``name="val"``: :class:`RecordValidation`)."""
    return {
        int(path.stem.rsplit("-r", 1)[1]): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(folder.glob(f"{name}-r*.jsonl"))
    }


def trained_weights(run: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """``(global_step, trainable state dict)`` of ``run/checkpoints/last.ckpt``."""
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return checkpoint["global_step"], checkpoint["state_dict"]


def shard_ids(folder: Path) -> list[str]:
    """Every sample id over all finished shards, with repeats (each shard read in full)."""
    return [i for path in shard_files(folder) for i in pq.read_table(path).column("id").to_pylist()]


def assert_labels_match_one_process(root: Path, folder: Path, prompts: Path) -> None:
    """Every stored row equals the labeller core run here, in this one process, on the same model."""
    model, tokenizer = load_backbone(str(root / "model"))
    meta = read_meta(folder)
    by_id = {p.id: p for p in JsonlPrompts(str(prompts), id_field="id")}
    for row in load_labels(folder):
        ids = render_prompt(by_id[row["id"]], tokenizer, MAX_PROMPT_TOKENS)
        want = label_prompt(model, ids, RESPONSE_TOKENS, eos_ids(model, tokenizer))
        assert (row["prompt_ids"], row["response_ids"]) == (ids, want.response_ids), row["id"]
        torch.testing.assert_close(row_scores(row, meta), want.scores, atol=1e-6, rtol=0)
