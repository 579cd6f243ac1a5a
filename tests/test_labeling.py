"""Ground-truth labels: exactness against eager attention, shard round-trip, resumption."""

import pytest
import torch

from lkv.backbone import model_signature
from lkv.data.prompts import Prompt
from lkv.data.shards import (
    ShardWriter,
    finished_ids,
    load_labels,
    read_meta,
    row_scores,
    shard_files,
)
from lkv.generation import eos_ids
from lkv.labeling import label_prompt, label_prompts, make_meta
from tests.reference import eager_reference


def test_label_matches_generate_and_eager_reference(tiny_model):
    model, tokenizer = tiny_model
    torch.manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (33,)).tolist()
    label = label_prompt(model, prompt, response_tokens=9, eos_token_ids=eos_ids(model, tokenizer))
    with torch.no_grad():
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=9, do_sample=False)
    assert label.response_ids == generated[0, 33:].tolist()
    full = torch.tensor([prompt + label.response_ids])
    want = eager_reference(model, full, num_keys=33, first_query=33)
    torch.testing.assert_close(label.scores, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(label.scores.sum(-1), torch.ones(want.shape[:2]), atol=1e-6, rtol=0)


def make_prompts(n: int, vocab: int) -> list[Prompt]:
    gen = torch.Generator().manual_seed(2)
    return [
        Prompt(
            id=f"p{i:03d}",
            messages=[{"role": "user", "content": "x"}],
            source="test",
            doc_id=f"d{i}",
            kind="synthetic",
            meta={"ids": torch.randint(0, vocab, (12 + i,), generator=gen).tolist()},
        )
        for i in range(n)
    ]


def run_label(model, tokenizer, prompts, folder, score_dtype="float32", store_scores=True):
    meta = make_meta(
        model_signature(model, tokenizer, "tiny").to_dict(),
        response_tokens=4,
        max_prompt_tokens=64,
        truncation="error",
        score_dtype=score_dtype,
        store_scores=store_scores,
        prompt_source="test",
    )
    stats = label_prompts(
        model, tokenizer, prompts, folder, meta, render=lambda p: p.meta["ids"], shard_size=2, progress=False
    )
    return meta, stats


def test_shard_round_trip(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = make_prompts(5, model.config.vocab_size)
    meta, stats = run_label(model, tokenizer, prompts, tmp_path)
    assert stats.labelled == 5
    assert len(shard_files(tmp_path)) == 3  # shard_size 2 → 2 + 2 + 1
    data = load_labels(tmp_path)
    assert data["id"] == [p.id for p in prompts]
    eos = eos_ids(model, tokenizer)
    for row, prompt in zip(data, prompts, strict=True):
        assert row["prompt_ids"] == prompt.meta["ids"]
        expected = label_prompt(model, prompt.meta["ids"], 4, eos)
        assert row["response_ids"] == expected.response_ids
        assert torch.equal(row_scores(row, read_meta(tmp_path)), expected.scores)


def test_float16_scores_and_responses_only(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = make_prompts(2, model.config.vocab_size)
    meta, _ = run_label(model, tokenizer, prompts, tmp_path / "half", score_dtype="float16")
    row = load_labels(tmp_path / "half")[0]
    full = label_prompt(model, prompts[0].meta["ids"], 4, eos_ids(model, tokenizer)).scores
    torch.testing.assert_close(row_scores(row, meta), full, atol=1e-3, rtol=1e-2)
    run_label(model, tokenizer, prompts, tmp_path / "resp", store_scores=False)
    row = load_labels(tmp_path / "resp")[0]
    assert row["scores"] == [] and len(row["response_ids"]) > 0


class Interrupt(Exception):
    pass


def interrupted(prompts, after: int):
    for i, prompt in enumerate(prompts):
        if i == after:
            raise Interrupt
        yield prompt


def test_interrupted_run_resumes_without_duplicates_or_gaps(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = make_prompts(7, model.config.vocab_size)
    with pytest.raises(Interrupt):
        run_label(model, tokenizer, interrupted(prompts, after=5), tmp_path / "cut")
    # shard_size 2: four samples were flushed, the fifth was lost with the process.
    assert finished_ids(tmp_path / "cut") == {p.id for p in prompts[:4]}
    _, stats = run_label(model, tokenizer, prompts, tmp_path / "cut")
    assert (stats.labelled, stats.skipped_done) == (3, 4)
    run_label(model, tokenizer, prompts, tmp_path / "whole")
    resumed, whole = load_labels(tmp_path / "cut"), load_labels(tmp_path / "whole")
    assert sorted(resumed["id"]) == sorted(whole["id"]) == [p.id for p in prompts]
    by_id = {row["id"]: row for row in whole}
    for row in resumed:
        assert row["response_ids"] == by_id[row["id"]]["response_ids"]
        assert row["scores"] == by_id[row["id"]]["scores"]


def test_folder_of_another_run_is_refused(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = make_prompts(1, model.config.vocab_size)
    meta, _ = run_label(model, tokenizer, prompts, tmp_path)
    meta.response_tokens = 99
    with pytest.raises(ValueError, match="different run.*response_tokens"):
        ShardWriter(tmp_path, meta)


def test_corrupt_shard_is_named(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    run_label(model, tokenizer, make_prompts(2, model.config.vocab_size), tmp_path)
    shard = shard_files(tmp_path)[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=shard.name):
        finished_ids(tmp_path)


def test_bad_scores_are_refused(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    meta, _ = run_label(model, tokenizer, make_prompts(1, model.config.vocab_size), tmp_path)
    writer = ShardWriter(tmp_path, meta)
    shape = (meta.num_layers, meta.num_kv_heads, 3)
    good = torch.full(shape, 1 / 3)
    with pytest.raises(ValueError, match="shape"):
        writer.add(id="a", prompt_ids=[1, 2], response_ids=[1], scores=good)
    for bad, why in ((good * float("nan"), "NaN"), (good - 1, "negative"), (good * 2, "sum to 1")):
        with pytest.raises(ValueError, match=why):
            writer.add(id="b", prompt_ids=[1, 2, 3], response_ids=[1], scores=bad)
