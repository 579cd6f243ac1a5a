"""Ground-truth labels: exactness against eager attention, shard round-trip, resumption."""

import pytest
import torch

from lkv.core.generation import eos_ids
from lkv.labels.labeller import label_prompt, make_meta
from lkv.labels.shards import (
    ShardWriter,
    finished_ids,
    load_labels,
    read_meta,
    row_scores,
    shard_files,
)
from lkv.model.backbone import model_signature
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


def write_labels(model, tokenizer, prompts, folder, score_dtype="float32", store_scores=True):
    """Label ``prompts`` (lists of token ids) in-process through the shard writer; returns the meta."""
    meta = make_meta(
        model_signature(model, tokenizer, "tiny").to_dict(),
        response_tokens=4,
        max_prompt_tokens=64,
        truncation="error",
        score_dtype=score_dtype,
        store_scores=store_scores,
        prompt_source="test",
    )
    writer = ShardWriter(folder, meta, shard_size=2)
    eos = eos_ids(model, tokenizer)
    for i, ids in enumerate(prompts):
        label = label_prompt(model, ids, 4, eos, store_scores)
        writer.add(id=f"p{i:03d}", prompt_ids=ids, response_ids=label.response_ids, scores=label.scores)
    writer.flush()
    return meta


def random_prompts(n: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, vocab, (12 + i,), generator=gen).tolist() for i in range(n)]


def test_shard_round_trip(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = random_prompts(5, model.config.vocab_size)
    meta = write_labels(model, tokenizer, prompts, tmp_path)
    assert len(shard_files(tmp_path)) == 3  # shard_size 2 → 2 + 2 + 1
    data = load_labels(tmp_path)
    assert data["id"] == [f"p{i:03d}" for i in range(5)]
    assert finished_ids(tmp_path) == set(data["id"])
    eos = eos_ids(model, tokenizer)
    for row, ids in zip(data, prompts, strict=True):
        assert row["prompt_ids"] == ids
        expected = label_prompt(model, ids, 4, eos)
        assert row["response_ids"] == expected.response_ids
        assert torch.equal(row_scores(row, read_meta(tmp_path)), expected.scores)
    assert read_meta(tmp_path) == meta


def test_float16_scores_and_responses_only(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    prompts = random_prompts(2, model.config.vocab_size)
    meta = write_labels(model, tokenizer, prompts, tmp_path / "half", score_dtype="float16")
    row = load_labels(tmp_path / "half")[0]
    full = label_prompt(model, prompts[0], 4, eos_ids(model, tokenizer)).scores
    torch.testing.assert_close(row_scores(row, meta), full, atol=1e-3, rtol=1e-2)
    write_labels(model, tokenizer, prompts, tmp_path / "resp", store_scores=False)
    row = load_labels(tmp_path / "resp")[0]
    assert row["scores"] == [] and len(row["response_ids"]) > 0


def test_folder_of_another_run_is_refused(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    meta = write_labels(model, tokenizer, random_prompts(1, model.config.vocab_size), tmp_path)
    meta.response_tokens = 99
    with pytest.raises(ValueError, match="different run.*response_tokens"):
        ShardWriter(tmp_path, meta)


def test_corrupt_shard_is_named(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    write_labels(model, tokenizer, random_prompts(2, model.config.vocab_size), tmp_path)
    shard = shard_files(tmp_path)[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match=shard.name):
        finished_ids(tmp_path)


def test_bad_scores_are_refused(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    meta = write_labels(model, tokenizer, random_prompts(1, model.config.vocab_size), tmp_path)
    writer = ShardWriter(tmp_path, meta)
    shape = (meta.num_layers, meta.num_kv_heads, 3)
    good = torch.full(shape, 1 / 3)
    with pytest.raises(ValueError, match="shape"):
        writer.add(id="a", prompt_ids=[1, 2], response_ids=[1], scores=good)
    for bad, why in ((good * float("nan"), "NaN"), (good - 1, "negative"), (good * 2, "sum to 1")):
        with pytest.raises(ValueError, match=why):
            writer.add(id="b", prompt_ids=[1, 2, 3], response_ids=[1], scores=bad)


def test_agnostic_label_is_the_question_and_response_attention_on_the_context(tiny_model):
    model, tokenizer = tiny_model
    torch.manual_seed(3)
    context = torch.randint(0, model.config.vocab_size, (29,)).tolist()
    question = torch.randint(0, model.config.vocab_size, (6,)).tolist()
    label = label_prompt(model, context, 7, eos_ids(model, tokenizer), question_ids=question)
    # The response is the one the whole prompt (context + question) gets...
    aware = label_prompt(model, context + question, 7, eos_ids(model, tokenizer))
    assert label.response_ids == aware.response_ids
    # ...and the target covers the context only, from the question's and the response's queries.
    full = torch.tensor([context + question + label.response_ids])
    want = eager_reference(model, full, num_keys=29, first_query=29)
    assert label.scores.shape[-1] == 29
    torch.testing.assert_close(label.scores, want, atol=1e-5, rtol=0)
    # Not the aware target cut to the context: the question's rows count too.
    assert not torch.allclose(
        label.scores, eager_reference(model, full, num_keys=29, first_query=35), atol=1e-4
    )


def test_split_prompt_cuts_where_agnostic_evaluation_cuts(tiny_tokenizer):
    from lkv.core.chat import encode_context, encode_question
    from lkv.labels.labeller import split_prompt

    content = "alpha beta gamma delta " * 20 + "\n\nWhat comes after gamma?"
    context, question = split_prompt(tiny_tokenizer, content, "What comes after gamma?", 1000, "error")
    assert context == encode_context(tiny_tokenizer, content.removesuffix("\n\nWhat comes after gamma?"))
    assert question == encode_question(tiny_tokenizer, "What comes after gamma?")
    limit = len(question) + 30
    short_context, same = split_prompt(tiny_tokenizer, content, "What comes after gamma?", limit, "middle")
    assert same == question and short_context == context[:15] + context[-15:]
    left, _ = split_prompt(tiny_tokenizer, content, "What comes after gamma?", limit, "left")
    assert left == context[-30:]
    assert split_prompt(tiny_tokenizer, content, "What comes after gamma?", limit, "skip") is None
    with pytest.raises(ValueError, match=f"over max_prompt_tokens={limit}"):
        split_prompt(tiny_tokenizer, content, "What comes after gamma?", limit, "error")
    with pytest.raises(ValueError, match="does not end with its question"):
        split_prompt(tiny_tokenizer, content, "Something else?", 1000, "error")
