"""LabelDataModule: variable-length batches, streaming, seeded shuffling, responses-only mode, model checks."""

from pathlib import Path

import datasets
import pytest
import torch

from lkv.core.generation import eos_ids
from lkv.labels.labeller import label_prompt, make_meta
from lkv.labels.shards import ShardWriter
from lkv.model.backbone import model_signature
from lkv.train.datamodule import LabelDataModule


def make_label_folder(
    model,
    tokenizer,
    folder: Path,
    num: int = 4,
    store_scores: bool = True,
    seed: int = 0,
    shard_size: int = 3,
) -> Path:
    """Label ``num`` random prompts of 20..(20+3·num) tokens with 5-token responses."""
    meta = make_meta(
        model_signature(model, tokenizer, "tiny").to_dict(),
        response_tokens=5,
        max_prompt_tokens=256,
        truncation="error",
        score_dtype="float32",
        store_scores=store_scores,
        prompt_source="test",
    )
    writer = ShardWriter(folder, meta, shard_size=shard_size)
    gen = torch.Generator().manual_seed(seed)
    for i in range(num):
        ids = torch.randint(0, model.config.vocab_size, (20 + 3 * i,), generator=gen).tolist()
        label = label_prompt(model, ids, 5, eos_ids(model, tokenizer), store_scores)
        writer.add(id=f"s{seed}-{i}", prompt_ids=ids, response_ids=label.response_ids, scores=label.scores)
    writer.flush()
    return folder


def ids_of(loader) -> list[str]:
    return [sample["id"] for batch in loader for sample in batch]


def train_loader(dm: LabelDataModule):
    dm.setup("fit")
    return dm.train_dataloader()


def test_batches_keep_variable_lengths(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    make_label_folder(model, tokenizer, tmp_path / "train", num=4)
    dm = LabelDataModule(train=str(tmp_path / "train"), batch_size=2, shuffle=False)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [2, 2]
    sample = batches[1][1]
    assert sample["id"] == "s0-3"
    assert sample["prompt_ids"].shape == (29,) and sample["prompt_ids"].dtype == torch.long
    assert sample["scores"].shape == (3, 2, 29)
    torch.testing.assert_close(sample["scores"].sum(-1), torch.ones(3, 2))
    assert dm.val_dataloader() == []  # no validation folder: Lightning skips validation


def test_shuffling_is_seeded_and_streaming_sees_the_same_samples(tiny_llama, tmp_path, monkeypatch):
    # datasets waits 5 s after each streamed pass (a pyarrow thread-shutdown workaround); not needed here
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)
    model, tokenizer = tiny_llama
    folder = str(make_label_folder(model, tokenizer, tmp_path / "train", num=7))
    order = ids_of(train_loader(LabelDataModule(train=folder, shuffle=False)))
    assert order == [f"s0-{i}" for i in range(7)]
    first = ids_of(train_loader(LabelDataModule(train=folder, seed=1)))
    again = ids_of(train_loader(LabelDataModule(train=folder, seed=1)))
    other = ids_of(train_loader(LabelDataModule(train=folder, seed=2)))
    assert first == again and sorted(first) == order and first != order and other != first
    streamed = LabelDataModule(train=folder, streaming=True, seed=1, shuffle_buffer=4)
    streamed_ids = ids_of(train_loader(streamed))
    assert sorted(streamed_ids) == order and streamed_ids != order
    streamed.set_epoch(1)
    assert ids_of(streamed.train_dataloader()) != streamed_ids


def test_responses_only_folder_gives_no_scores(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    folder = make_label_folder(model, tokenizer, tmp_path / "train", num=2, store_scores=False)
    dm = LabelDataModule(train=str(folder), shuffle=False)
    (sample,) = next(iter(train_loader(dm)))
    assert sample["scores"] is None and sample["response_ids"].numel() > 0


def test_check_model_names_folder_and_both_models(tiny_llama, tiny_qwen, tmp_path):
    llama, tokenizer = tiny_llama
    qwen, qwen_tokenizer = tiny_qwen
    folder = make_label_folder(llama, tokenizer, tmp_path / "heldout", num=1)
    dm = LabelDataModule(train=str(folder), val=str(folder))
    dm.check_model(model_signature(llama, tokenizer, "same"))
    with pytest.raises(
        ValueError, match=r"label folder .*heldout \(train\).*llama.*qwen3.*num_layers: 3 vs 2"
    ):
        dm.check_model(model_signature(qwen, qwen_tokenizer, "other"))


def test_missing_folder_is_a_clear_error(tmp_path):
    dm = LabelDataModule(train=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="lkv label"):
        dm.setup("fit")
