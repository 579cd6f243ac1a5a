"""scripts/smoke_gpu.sh in its CPU dry run: the paper recipe's commands chained with no manual step, and the
checks its summary applies (Qwen3 labels rendered with thinking off; eval memory within its bound)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.perf import smoke

ROOT = Path(__file__).resolve().parents[2]
STAGES = [
    "model-llama",
    "model-qwen",
    "label-train-a",
    "label-train-b",
    "label-heldout",
    "label-qwen",
    "fit",
    "fit-resume",
    "eval-llama",
    "eval-qwen",
    "bench-ttft",
]


@pytest.mark.slow
def test_smoke_dry_run_labels_fits_resumes_evaluates_and_benches(tmp_path):
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(
        ["bash", "scripts/smoke_gpu.sh"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=900,
        capture_output=True,
        text=True,
    )
    for stage in STAGES:  # each stage's wall time is printed as it ends
        assert f"smoke: {stage} took " in run.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == STAGES
    assert all(s["seconds"] > 0 and s["peak_bytes"] > 0 for s in summary["stages"])
    assert summary["total_seconds"] == pytest.approx(sum(s["seconds"] for s in summary["stages"]))
    # the first run stops at step 4, the resumed one continues from last.ckpt to step 6
    assert [len(run) for run in summary["step_seconds"]] == [4, 2]
    assert summary["median_s_per_step"] > 0
    steps = {p.stem.rsplit("step=", 1)[1] for p in (tmp_path / "checkpoints").glob("*step=*.ckpt")}
    assert steps >= {"2", "4", "6"}
    for methods in summary["ttft"].values():
        assert set(methods) == {"snapkv", "lookaheadkv", "laq", "speckv"}
    labels = tmp_path / "labels"
    metas = {
        name: json.loads((labels / name / "meta.json").read_text()) for name in ("train-a", "heldout", "qwen")
    }
    assert metas["train-a"]["store_scores"] is False and metas["heldout"]["store_scores"] is False
    assert metas["qwen"]["store_scores"] is True and metas["qwen"]["model"]["model_type"] == "qwen3"
    # Qwen3's prompts end with the empty think block; the eval stages are there (their memory check needs CUDA)
    assert [(c["check"], c["ok"]) for c in summary["checks"]] == [
        ("thinking off (qwen)", True),
        ("eval memory (eval-llama)", None),
        ("eval memory (eval-qwen)", None),
    ]
    for name, methods in (
        ("eval-llama", {"fullkv", "lookaheadkv", "snapkv"}),
        ("eval-qwen", {"fullkv", "snapkv", "oracle"}),
    ):
        rows = [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
        assert {r["method"] for r in rows if r["task"] == "niah"} == methods
        assert len({r["sample"] for r in rows if r["task"] == "niah"}) == 8  # one chunk at --batch_size 8
        assert {r["task"] for r in rows} == {"niah", "importance"}
        run_info = json.loads((tmp_path / name / "run.json").read_text())
        assert run_info["chat_template_kwargs"] == {"enable_thinking": False}
    # validation on the responses-only held-out folder: ground truth computed online
    events = EventAccumulator(str(next((tmp_path / "runs").rglob("events.out.tfevents.*")).parent))
    events.Reload()
    assert "val/kl" in events.Tags()["scalars"]


def fake_eval_stage(tmp_path, peak_gib: float) -> dict:
    """An `lkv eval` stage record as a GPU run writes it: a tiny model folder, a results file, a peak."""
    from tests.conftest import build_tiny_model

    model, _ = build_tiny_model("llama")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    output = tmp_path / "eval"
    output.mkdir()
    rows = [{"prompt_tokens": 16384, "answer_ids": [1] * 16}, {"prompt_tokens": 100}]
    (output / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [
        "eval",
        "--model",
        str(folder),
        "--dtype",
        "float32",
        "--batch_size",
        "8",
        "--output",
        str(output),
    ]
    peak = int(peak_gib * smoke.GIB)
    return {
        "stage": "eval-x",
        "seconds": 1.0,
        "peak_bytes": peak,
        "peak_kind": "cuda_max_memory_allocated",
        "command": command,
    }


def test_the_eval_memory_check_bounds_a_gpu_stage_by_b_plus_two_caches(tmp_path):
    stage = fake_eval_stage(tmp_path, 0)
    weights = sum(f.stat().st_size for f in (tmp_path / "model").glob("*.safetensors"))
    cache = (16384 + 16) * 2 * 3 * 2 * 16 * 4  # tokens × (K+V · layers · KV heads · head dim · fp32)
    bound = weights + 10 * cache + smoke.EVAL_SLACK_BYTES
    (within,) = [
        c for c in smoke.checks([{**stage, "peak_bytes": bound}], []) if c["check"].startswith("eval")
    ]
    (over,) = smoke.checks([{**stage, "peak_bytes": bound + 1}], [])
    assert within["ok"] is True and over["ok"] is False and "10 ×" in over["detail"]
    (cpu,) = smoke.checks([{**stage, "peak_kind": "ru_maxrss"}], [])
    assert cpu["ok"] is None


def test_the_smoke_tokenizers_render_like_the_real_chat_formats():
    from lkv.core.chat import render_chat, template_reads_variables

    qwen = smoke.build_tokenizer(400, chat="qwen3")
    message = [{"role": "user", "content": "hi"}]
    assert (
        render_chat(qwen, message)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + smoke.EMPTY_THINK
    )
    assert render_chat(qwen, message, enable_thinking=True).endswith("<|im_start|>assistant\n")
    llama = smoke.build_tokenizer(400)
    assert template_reads_variables(qwen) and not template_reads_variables(llama)
    assert qwen.eos_token == "<|im_end|>" and llama.eos_token == "<|eot_id|>"
