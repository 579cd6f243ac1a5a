"""kvpress's own pipeline answers a needle question from a context compressed by a trained lkv adapter.

Real model (the embedded SmolLM2-135M), question-agnostic as kvpress runs it: the context is compressed
before the question is seen. The adapter is ``$LKV_KVPRESS_ADAPTER`` (an ``lkv export`` folder) if set, else
one trained here in a few minutes with the real commands: ``lkv label`` (6 held-out-free training prompts),
``lkv fit`` (2 epochs of the embedded config), ``lkv export``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kvpress")

from transformers import pipeline  # noqa: E402

from lkv.eval.tasks.needle import NeedleTask  # noqa: E402
from lkv.integrations.kvpress import lookahead_press  # noqa: E402
from lkv.model.backbone import load_backbone  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def lkv(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "lkv.cli", *args], cwd=cwd, check=True, env={**os.environ})


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory) -> Path:
    if os.environ.get("LKV_KVPRESS_ADAPTER"):
        return Path(os.environ["LKV_KVPRESS_ADAPTER"])
    work = tmp_path_factory.mktemp("adapter")
    lkv(
        "label", "--output", "labels", "--response_tokens", "32", "--max_prompt_tokens", "512",
        "--prompts.class_path", "lkv.labels.builtin_prompts.BuiltinPrompts",
        "--prompts.init_args.split", "train", "--prompts.init_args.num_prompts", "6",
        cwd=work,
    )  # fmt: skip
    lkv(
        "fit", "--config", str(ROOT / "configs/smollm2_135m.yaml"), "--data.train", "labels",
        "--data.val", "labels", "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "2",
        cwd=work,
    )  # fmt: skip
    lkv("export", "--ckpt", "runs/smollm2_135m/checkpoints/last.ckpt", "--output", "adapter", cwd=work)
    return work / "adapter"


@pytest.mark.slow
def test_kvpress_pipeline_finds_the_needle_with_a_trained_adapter(trained_adapter):
    model, tokenizer = load_backbone("smollm2-135m")
    sample = NeedleTask(lengths=(1024,), depths=(0.5,)).samples(tokenizer)[0]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = lookahead_press(trained_adapter, model, compression_ratio=0.75)
    answer = pipe(
        sample.context,
        question=sample.question,
        answer_prefix=sample.answer_prefix,
        press=press,
        max_new_tokens=sample.max_new_tokens,
    )["answer"]
    assert sample.answers[0] in answer, f"{answer!r} misses the needle {sample.answers[0]}"
