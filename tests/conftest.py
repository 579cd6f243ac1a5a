"""Shared fixtures: tiny random models with a small real tokenizer, and a tiny text corpus, all built in code.

Nothing is downloaded. The tokenizer is a byte-level BPE (any text round-trips) with a ChatML-like chat
template, so prompt rendering and generation behave as with a real model, only smaller.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import datasets
import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import lkv.train.module
from lkv.core.generation import eos_ids
from lkv.eval.tasks import NeedleTask
from lkv.labels.labeller import Label, label_prompt, label_questions, make_meta
from lkv.labels.predict import label_setting
from lkv.labels.shards import ShardWriter
from lkv.model.backbone import model_signature
from lkv.train.callbacks import ImportanceImages
from lkv.train.datamodule import LabelDataModule
from lkv.train.module import LookaheadKVModule
from lkv.train.optim import OptimSettings

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3's switch, reduced to its generation prompt: with enable_thinking=False the assistant turn opens with an
# empty think block (the real template's test is `enable_thinking is defined and enable_thinking is false`)
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# 256 byte symbols + 3 special tokens + merges; the tiny models' vocabulary is at least this large.
TOKENIZER_VOCAB = 300
MODEL_VOCAB = 320
FAMILIES = ("llama", "qwen")

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog does not mind.",
    "A startup is a company designed to grow fast. Growth is what makes it a startup.",
    "The special magic number for maple is 7321945. Remember it for later.",
    "def add(a, b):\n    return a + b\n\nclass Counter:\n    def __init__(self):\n        self.count = 0\n",
    "import os\nimport sys\n\nfor name in sorted(os.listdir('.')):\n    print(name)\n",
]

ESSAYS = {
    "alpha": (
        "March 2020. Most ideas that look bad are bad. But some ideas that look bad are actually good, and "
        "those are the ones worth looking for. The reason is simple: if an idea looked good, someone would "
        "already be working on it. So the best ideas hide behind a mask of badness. Founders who learn to "
        "see through that mask have an advantage. They can work on things nobody else will touch. It takes "
        "a certain kind of stubbornness to keep going when everyone tells you the idea is bad. "
    )
    * 4,
    "beta": (
        "The way to get startup ideas is not to try to think of startup ideas. It is to look for problems, "
        "preferably problems you have yourself. The very best startup ideas tend to have three things in "
        "common: they are something the founders themselves want, that they themselves can build, and that "
        "few others realize are worth doing. Microsoft, Apple, Yahoo, Google, and Facebook all began this way. "
    )
    * 4,
    "gamma": (
        "Programming languages are not just technologies but habits of mind. A language shapes the way you "
        "think about programs, and the programs you can imagine writing. Lisp was the first language to "
        "treat code as data. Hackers who learn it often say it changed how they write in every other "
        "language. That is why it is worth learning even if you never use it at work. "
    )
    * 4,
    "delta": (
        "Cities send messages. New York tells you to make more money. Boston tells you to be smarter. "
        "Silicon Valley tells you to be more powerful. You can hear these messages in what people talk "
        "about in cafes, and in what they ask when they meet you. The message a city sends affects the "
        "ambitions of the people who live there, often more than they realize. "
    )
    * 4,
}

STDLIB = {
    "shapes.py": (
        "import math\n\n\n"
        + "".join(
            f'def area_{i}(radius):\n    """Area of circle number {i}."""\n    return math.pi * radius ** 2\n\n\n'
            for i in range(20)
        )
    ),
    "pkg/queueing.py": (
        "from collections import deque\n\n\n"
        + "".join(
            f"class Queue{i}:\n    def __init__(self):\n        self.items = deque()\n\n"
            f"    def push(self, item):\n        self.items.append(item)\n\n\n"
            for i in range(15)
        )
    ),
    "test/test_shapes.py": "def test_area():\n    assert True\n" * 50,
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ``<|im_end|>`` as EOS, ``<|endoftext|>`` as pad and a chat template."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    family: str = "llama", attn_implementation: str = "sdpa", **overrides
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A frozen float32 random model of ``family`` (llama: 3 layers, tied head; qwen: Qwen3, 2 layers).

    Both have hidden size 64, 4 query heads and 2 KV heads (GQA group 2) of dim 16; ``overrides`` go to
    the config. Score capture is installed, as :func:`lkv.model.backbone.load_backbone` does.
    """
    from lkv.core.attention import install_capture

    tokenizer = build_tokenizer()
    common = {
        "vocab_size": MODEL_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "attn_implementation": attn_implementation,
    }
    torch.manual_seed(0)
    if family == "llama":
        config = LlamaConfig(**{**common, "num_hidden_layers": 3, "tie_word_embeddings": True, **overrides})
        model = LlamaForCausalLM(config)
    elif family == "qwen":
        config = Qwen3Config(
            **{**common, "num_hidden_layers": 2, "head_dim": 16, "tie_word_embeddings": False, **overrides}
        )
        model = Qwen3ForCausalLM(config)
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    model.eval().requires_grad_(False)
    install_capture(model)
    return model, tokenizer


@pytest.fixture
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture
def thinking_tokenizer() -> PreTrainedTokenizerFast:
    """:func:`build_tokenizer` with a Qwen3-style chat template that reads ``enable_thinking``."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


@pytest.fixture
def make_tiny_model() -> Callable[..., tuple[PreTrainedModel, PreTrainedTokenizerFast]]:
    """Factory: ``make_tiny_model(family="llama", attn_implementation="sdpa", **config_overrides)``."""
    return build_tiny_model


@pytest.fixture
def tiny_llama() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    return build_tiny_model("llama")


@pytest.fixture
def tiny_qwen() -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    return build_tiny_model("qwen")


@pytest.fixture(params=FAMILIES)
def tiny_model(request) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Each tiny model family in turn."""
    return build_tiny_model(request.param)


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """``(essays_dir, stdlib_dir)``: four short essays and a small Python tree (with a test folder to skip)."""
    essays = tmp_path / "essays"
    essays.mkdir()
    for name, text in ESSAYS.items():
        (essays / f"{name}.txt").write_text(text)
    stdlib = tmp_path / "stdlib"
    for relative, text in STDLIB.items():
        (stdlib / relative).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / relative).write_text(text)
    return essays, stdlib


def make_label_folder(
    model,
    tokenizer,
    folder: Path,
    num: int = 4,
    store_scores: bool = True,
    seed: int = 0,
    shard_size: int = 3,
    questions: int = 0,
    copied: bool = False,
) -> Path:
    """Label ``num`` random prompts of 20..(20+3·num) tokens with 5-token responses; with ``questions`` k > 0,
    agnostic labels of those prompts as contexts, each asked k random 4-token questions (union of them); with
    ``copied``, responses that copy prompt tokens 4..9 verbatim, without scores (the ground truth is online)."""
    store_scores = store_scores and not copied
    meta = make_meta(
        model_signature(model, tokenizer, "tiny").to_dict(),
        response_tokens=5,
        max_prompt_tokens=256,
        truncation="error",
        score_dtype="float32",
        store_scores=store_scores,
        prompt_source="test",
        extra=label_setting("agnostic", "max") if questions else None,
    )
    writer = ShardWriter(folder, meta, shard_size=shard_size)
    gen = torch.Generator().manual_seed(seed)
    for i in range(num):
        ids = torch.randint(0, model.config.vocab_size, (20 + 3 * i,), generator=gen).tolist()
        if questions:
            asked = [
                torch.randint(0, model.config.vocab_size, (4,), generator=gen).tolist()
                for _ in range(questions)
            ]
            label = label_questions(model, ids, asked, 5, eos_ids(model, tokenizer))
        elif copied:
            label = Label(ids[4:10], None)
        else:
            label = label_prompt(model, ids, 5, eos_ids(model, tokenizer), store_scores)
        writer.add(id=f"s{seed}-{i}", prompt_ids=ids, response_ids=label.response_ids, scores=label.scores)
    writer.flush()
    return folder


# validation settings of every tiny predictor (lookahead module or probe)
TINY_EVAL = {"snapkv_window": 8, "snapkv_kernel": 3, "eval_budgets": (4, 8)}
TINY = {"num_lookahead": 4, "optim": OptimSettings(lr=1e-2), **TINY_EVAL}


@pytest.fixture
def no_stream_sleep(monkeypatch) -> None:
    """No pause after each streamed pass: recent datasets releases sleep 5 s there (a pyarrow thread-shutdown
    workaround; ``datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN``), older ones such as 4.0 have no such pause."""
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0, raising=False)


@pytest.fixture
def tiny_backbone(monkeypatch):
    """``lkv.train.module.load_backbone`` returns the tiny Llama (same weights every call); yields its family name."""
    monkeypatch.setattr(lkv.train.module, "load_backbone", lambda model, **kw: build_tiny_model("llama"))
    return "llama"


@pytest.fixture(scope="module")
def label_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny-Llama label folders: ``train`` (6), ``val`` (2), ``online`` (= ``val`` without scores), ``qwen``,
    ``copied`` (6, responses copying a prompt run)."""
    root = tmp_path_factory.mktemp("labels")
    model, tokenizer = build_tiny_model("llama")
    qwen, qwen_tokenizer = build_tiny_model("qwen")
    return {
        "train": make_label_folder(model, tokenizer, root / "train", num=6),
        "val": make_label_folder(model, tokenizer, root / "val", num=2, seed=1),
        "online": make_label_folder(model, tokenizer, root / "online", num=2, seed=1, store_scores=False),
        "qwen": make_label_folder(qwen, qwen_tokenizer, root / "qwen", num=1),
        "copied": make_label_folder(model, tokenizer, root / "copied", num=6, copied=True),
    }


class CountSteps(L.Callback):
    def __init__(self) -> None:
        self.batches = 0
        self.start_embeddings = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start_embeddings = pl_module.adapter.embeddings.detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1


def fit(
    root: Path, folders: dict[str, Path], max_steps: int, ckpt_path: str | None = None, train: str = "train"
):
    counter = CountSteps()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=TensorBoardLogger(root, name="tb"),
        callbacks=[
            ModelCheckpoint(dirpath=root / "checkpoints", save_last=True),
            ImportanceImages(),
            counter,
        ],
        val_check_interval=3,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = LookaheadKVModule(model="tiny", **TINY)
    data = LabelDataModule(train=str(folders[train]), val=str(folders["val"]))
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer, module, counter


# the held-out share that puts two of tiny_corpus's four essays (beta, gamma) on the held-out side
TINY_HELDOUT = 0.5


def tiny_needle_task(corpus: tuple[Path, Path], **kwargs) -> NeedleTask:
    """A 60-token needle task over ``tiny_corpus``'s held-out essays; ``kwargs`` override its settings."""
    settings = {"lengths": (60,), "depths": (0.5,), "max_new_tokens": 3, "essays_dir": str(corpus[0])}
    return NeedleTask(heldout_fraction=TINY_HELDOUT, **{**settings, **kwargs})


@pytest.fixture
def source_roots(tmp_path: Path) -> dict[str, str]:
    """Roots of two text sources (``lkv.labels.sources``) of 120 documents each: a dialogue (line units) and a
    tree of copyright files (sentence units, 20 sentences each), words drawn from a short list."""
    import random

    words = (
        "harvest",
        "lantern",
        "orchard",
        "meadows",
        "granite",
        "thunder",
        "compass",
        "willows",
        "saffron",
    )
    rng = random.Random(0)
    dialogue = tmp_path / "dialogue"
    dialogue.mkdir()
    turns = "".join(
        f"- - The {rng.choice(words)} question {i} arrived.\n  - Then {rng.choice(words)} answers came.\n"
        for i in range(120)
    )
    (dialogue / "talk.yml").write_text(f"conversations:\n{turns}")
    docs = tmp_path / "doc"
    for i in range(120):
        (docs / f"pkg{i}").mkdir(parents=True)
        text = " ".join(f"The {rng.choice(words)} clause {j} of package {i} applies." for j in range(20))
        (docs / f"pkg{i}" / "copyright").write_text(text)
    return {"chatterbot-dialogue": str(dialogue), "debian-copyright": str(docs)}
