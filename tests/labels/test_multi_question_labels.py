"""Question-agnostic labels of a context asked several questions: the union (or mean) of the questions' labels,
over exactly the context tokens that the question-agnostic evaluation prefills."""

import json

import pytest
import torch

from lkv.commands.label import label
from lkv.core.generation import eos_ids
from lkv.eval.tasks import Sample, encode_sample
from lkv.labels.facts import TRAIN_KEYS
from lkv.labels.labeller import label_prompt, label_questions, reduce_questions, split_questions
from lkv.labels.multi_question_prompts import MultiQuestionPrompts
from lkv.labels.shards import load_labels, read_meta, row_scores
from lkv.labels.sources import HELDOUT_SOURCES, document_split
from lkv.model.backbone import load_backbone
from tests.labels.test_label_command import saved_model  # noqa: F401


def random_ids(model, n: int, seed: int) -> list[int]:
    return torch.randint(
        0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_the_union_label_is_the_max_of_the_questions_labelled_alone(tiny_model, reduction):
    """One prefill of the context serves every question: the label equals the reduction of each question
    labelled alone (context and question prefilled together) to float rounding, responses token for token."""
    model, tokenizer = tiny_model
    eos = eos_ids(model, tokenizer)
    context = random_ids(model, 31, 0)
    questions = [random_ids(model, n, seed) for seed, n in ((1, 5), (2, 7), (3, 4))]
    got = label_questions(model, context, questions, 6, eos, reduction)
    alone = [label_prompt(model, context, 6, eos, question_ids=q) for q in questions]
    stacked = torch.stack([a.scores for a in alone])
    if reduction == "max":
        union = stacked.amax(0)
        want = union / union.sum(-1, keepdim=True)
        # the union keeps what any question needs: each question's top token is the union's top-ranked too
        for one in alone:
            top = one.scores.argmax(-1, keepdim=True)
            torch.testing.assert_close(
                got.scores.gather(-1, top) * union.sum(-1, keepdim=True),
                union.gather(-1, top),
                atol=1e-6,
                rtol=0,
            )
    else:
        want = stacked.mean(0)
    torch.testing.assert_close(got.scores, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.scores.sum(-1), torch.ones(got.scores.shape[:2]), atol=1e-6, rtol=0)
    assert got.response_ids == [t for a in alone for t in a.response_ids]
    # one question: its own label
    (only,) = alone[:1]
    one = label_questions(model, context, questions[:1], 6, eos, reduction)
    torch.testing.assert_close(one.scores, only.scores, atol=1e-6, rtol=0)


def test_no_question_or_an_unknown_reduction_is_refused(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match=r"at least one question \(k ≥ 1\), found none"):
        label_questions(model, random_ids(model, 9, 0), [], 4, eos_ids(model, tokenizer))
    with pytest.raises(ValueError, match="at least one question"):
        split_questions(tokenizer, "some context\n\n", [], 100, "error")
    with pytest.raises(
        ValueError, match=r"question_reduction: expected one of \('max', 'mean'\), found 'min'"
    ):
        reduce_questions([torch.ones(1, 1, 3) / 3] * 2, "min")


def make(roots, **kwargs) -> MultiQuestionPrompts:
    """Multi-question prompts of ``source_roots``' copyright files (140 words each: the dialogues' are ~11)."""
    settings = {
        "sources": ("debian-copyright",),
        "num_prompts": 8,
        "min_words": 30,
        "max_words": 60,
        "roots": roots,
    }
    return MultiQuestionPrompts(**{**settings, **kwargs})


@pytest.mark.parametrize("split", ["train", "dev"])
def test_contexts_from_their_split_hold_each_fact_once_in_its_own_stratum(source_roots, split):
    prompts = list(make(source_roots, questions=3, split=split))
    assert len({p.id for p in prompts}) == 8 and [
        p.id for p in make(source_roots, questions=3, split=split)
    ] == [p.id for p in prompts]
    for prompt in prompts:
        meta = prompt.meta
        assert document_split(prompt.doc_id) == split and meta["context"].endswith("\n\n")
        assert len(meta["questions"]) == len(set(meta["answers"])) == 3
        for answer, evidence in zip(meta["answers"], meta["evidence"], strict=True):
            assert meta["context"].count(evidence) == 1 and answer in evidence
        assert 30 <= meta["words"] <= 60 + 7  # a whole passage: the last sentence may pass max_words
        # one fact per third of the passage (≥ 5 sentences): the i-th shallowest lies in the i-th third
        for i, depth in enumerate(sorted(meta["depths"])):
            assert i / 3 - 1 / 5 <= depth <= (i + 1) / 3 + 1e-4, meta["depths"]
        assert prompt.messages == [{"role": "user", "content": meta["context"] + meta["questions"][0]}]


def test_a_source_without_documents_of_min_words_is_refused(source_roots):
    prompts = make(source_roots, sources=("chatterbot-dialogue",))
    with pytest.raises(ValueError, match="chatterbot-dialogue: 100 drawn documents held no text of 30 words"):
        list(prompts)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"questions": 0}, r"questions: expected 1 to \d+ questions per context .*found 0"),
        ({"questions": len(TRAIN_KEYS) + 1}, "questions: expected 1 to"),
        (
            {"sources": ("paul-graham-essays", HELDOUT_SOURCES[0])},
            "is in the held-out group.*no training prompt may use it",
        ),
        ({"fact_formats": ("passphrase",)}, "are evaluation-only"),
        ({"split": "heldout"}, "split: expected 'train' or 'dev' documents, found 'heldout'"),
    ],
)
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as error:
        MultiQuestionPrompts(**settings)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_agnostic_rows_hold_the_context_the_agnostic_evaluation_prefills(
    saved_model,  # noqa: F811
    source_roots,
    tmp_path,
    reduction,
):
    prompts = make(source_roots, num_prompts=3, questions=3)
    out = tmp_path / "labels"
    settings = {
        "output": str(out),
        "prompts": prompts,
        "model": str(saved_model),
        "response_tokens": 4,
        "max_prompt_tokens": 1024,
        "score_dtype": "float32",
        "accelerator": "cpu",
        "progress": False,
        "label_mode": "agnostic",
    }
    label(**settings, question_reduction=reduction)
    meta = read_meta(out)
    assert meta.extra["setting"] == meta.setting == "agnostic"
    assert meta.extra["question_reduction"] == reduction and "label_mode" not in meta.extra
    model, tokenizer = load_backbone(str(saved_model))
    by_id = {p.id: p for p in prompts}
    rows = list(load_labels(out))
    assert sorted(r["id"] for r in rows) == sorted(by_id)
    for row in rows:
        prompt = by_id[row["id"]]
        samples = [
            Sample(id=f"{prompt.id}-{j}", context=prompt.meta["context"], question=q, answers=[])
            for j, q in enumerate(prompt.meta["questions"])
        ]
        encoded = [encode_sample(s, tokenizer) for s in samples]
        # what MultiQuestionRun prefills and compresses, token for token, and each question as it asks it
        assert all(row["prompt_ids"] == context for context, _ in encoded)
        asked = [question for _, question in encoded]
        want = label_questions(model, row["prompt_ids"], asked, 4, eos_ids(model, tokenizer), reduction)
        assert row["response_ids"] == want.response_ids
        torch.testing.assert_close(row_scores(row, meta), want.scores, atol=1e-6, rtol=0)
    if reduction == "max":  # a folder from when the setting was spelled label_mode grows as it was
        path = out / "meta.json"
        old = json.loads(path.read_text())
        old["extra"] = {k: v for k, v in old["extra"].items() if k not in ("setting", "question_reduction")}
        path.write_text(json.dumps({**old, "extra": {**old["extra"], "label_mode": "agnostic"}}))
        assert read_meta(out).setting == "agnostic"
        label(**{**settings, "prompts": make(source_roots, num_prompts=4, questions=3)})
        assert (
            len(load_labels(out)) == 4 and json.loads(path.read_text())["extra"]["label_mode"] == "agnostic"
        )
    other = "mean" if reduction == "max" else "max"
    with pytest.raises(
        ValueError, match=f"with setting=.*'question_reduction': '{reduction}'.*asks for .*'{other}'"
    ):
        label(**settings, question_reduction=other)
