"""Needle families in and out of the training distribution, the pydoc haystack, and the separation of
evaluation-only fact formats from the training prompts."""

import re

import pytest

from lkv.eval.tasks import TASKS, NeedleFamilyTask, encode_sample
from lkv.eval.tasks.needle_families import FAMILIES, IN_FAMILIES, OUT_FAMILIES
from lkv.eval.tasks.text import PydocProse, split_sentences
from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.facts import FACT_FORMATS, TRAIN_KEYS, fact_format, formats
from lkv.labels.prompts import STDLIB_SOURCE, stdlib_documents
from lkv.labels.sources import PYDOC_SOURCE, pydoc_prose

FRACTION = 0.5  # four tiny essays: beta and gamma held out


def fixed_text(template: str) -> str:
    """The longest literal piece of a fact template (between its {key}/{value} slots)."""
    return max(re.split(r"\{key\}|\{value\}", template), key=len)


def task(corpus, **kwargs) -> NeedleFamilyTask:
    settings = {
        "lengths": (120,),
        "depths": (0.5,),
        "essays_dir": str(corpus[0]),
        "heldout_fraction": FRACTION,
    }
    return NeedleFamilyTask(**{**settings, **kwargs})


@pytest.mark.parametrize("family", OUT_FAMILIES)
def test_every_out_of_distribution_family_hides_recoverable_needles(tiny_corpus, tiny_tokenizer, family):
    spec = FAMILIES[family]
    samples = task(tiny_corpus, families=(family,), haystacks=("essays",), samples_per_cell=3).samples(
        tiny_tokenizer
    )
    assert len({s.id for s in samples}) == 3 and all(s.id.startswith("needle_ood-") for s in samples)
    for sample in samples:
        assert len(sample.answers) == spec.asked
        chosen = [fact_format(name) for name in sample.meta["formats"]]
        assert len(chosen) == spec.needles and all(f.side == "eval" for f in chosen)
        if spec.same_format:
            assert len(set(sample.meta["formats"])) == 1
        for value in sample.answers:
            assert sample.context.count(value) == 1 and value not in sample.question
        assert sample.meta["distribution"] == "out-of-distribution" and sample.meta["family"] == family
        assert task(tiny_corpus).score(" and ".join(sample.answers), sample) == {"string_match": 1.0}
        assert task(tiny_corpus).score("I do not know.", sample) == {"string_match": 0.0}
        answer_tokens = len(tiny_tokenizer(" ".join(sample.answers), add_special_tokens=False)["input_ids"])
        assert sample.max_new_tokens == answer_tokens + 16
        context, question = encode_sample(sample, tiny_tokenizer)
        assert sample.question in tiny_tokenizer.decode(question)
        # Other facts than the training ones, or (reworded) the training fact asked in words training never
        # uses.
        train_statements = {f.statement for f in formats("train")}
        if all(f.statement in train_statements for f in chosen):
            assert not {q for f in chosen for q in f.questions} & {
                q for f in formats("train") for q in f.questions
            }
        else:
            for statement in train_statements:
                assert fixed_text(statement) not in sample.context


def test_reworded_questions_are_direct_requests_in_words_training_never_uses(tiny_corpus, tiny_tokenizer):
    reworded, trained = fact_format("magic_number_reworded"), fact_format("magic_number")
    assert reworded.statement == trained.statement  # the training fact; only the question is new
    train_questions = [q for f in formats("train") for q in f.questions]
    openings = {tuple(q.split()[:3]) for q in train_questions}
    for question in reworded.questions:
        assert question not in train_questions and tuple(question.split()[:3]) not in openings
        # The key inside a request, never first as a label: "{key}: which special magic number does the text
        # give?" made the full-cache model describe the text instead (FullKV 0/3 on SmolLM2-135M).
        assert not question.startswith("{key}")
    samples = task(
        tiny_corpus, families=("magic_number_reworded",), haystacks=("essays", "pydoc"), samples_per_cell=8
    ).samples(tiny_tokenizer)
    asked = set()
    for sample in samples:
        (value,) = sample.answers
        key = re.search(rf"special magic number for (\S+) is {value}\.", sample.context).group(1)
        asked |= {q for q in reworded.questions if q.format(key=key) == sample.question}
        _, question_ids = encode_sample(sample, tiny_tokenizer)
        assert sample.question in tiny_tokenizer.decode(question_ids)
        # the full-cache model's usual answers: the value in a sentence scores 1, a description of the text 0
        full_answer = f"The special magic number that belongs to {key} is {value}. This number is"
        assert task(tiny_corpus).score(full_answer, sample) == {"string_match": 1.0}
        assert task(tiny_corpus).score("The text provides a detailed explanation of", sample) == {
            "string_match": 0.0
        }
    assert asked == set(reworded.questions)  # every wording is asked


@pytest.mark.parametrize(("family", "count"), [("distractor", 3), ("trained_distractors", 8)])
def test_distractors_share_a_format_but_not_key_or_value(tiny_corpus, tiny_tokenizer, family, count):
    (sample,) = task(tiny_corpus, families=(family,), haystacks=("essays",)).samples(tiny_tokenizer)
    fmt = fact_format(sample.meta["formats"][0])
    assert (fmt.side == "train") == (family == "trained_distractors")
    needles = [s for s in split_sentences(sample.context) if fixed_text(fmt.statement) in s]
    assert len(needles) == count and len(set(needles)) == count
    assert sum(a in n for n in needles for a in sample.answers) == 1


def test_in_distribution_families_use_the_training_formats_and_keys(tiny_corpus, tiny_tokenizer):
    samples = task(tiny_corpus, distribution="in", samples_per_cell=2).samples(tiny_tokenizer)  # essays only
    assert {s.meta["family"] for s in samples} == set(IN_FAMILIES)
    for sample in samples:
        fmt = fact_format(sample.meta["family"])
        assert fmt.side == "train" and sample.meta["distribution"] == "in-distribution"
        key = next(
            k for k in TRAIN_KEYS if fmt.statement.format(key=k, value=sample.answers[0]) in sample.context
        )
        assert sample.question in {q.format(key=key) for q in fmt.questions}
        assert sample.id.startswith("needle_id-")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distribution": "in", "families": ("passphrase",)}, "only trained families"),
        ({"distribution": "in", "haystacks": ("essays", "pydoc")}, "only trained families"),
        ({"families": ("nope",)}, "unknown needle families"),
        ({"haystacks": ("wiki",)}, "haystacks must be"),
        ({"distribution": "both"}, "distribution must be"),
    ],
)
def test_bad_settings_are_refused(tiny_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        task(tiny_corpus, **kwargs)


def test_pydoc_haystack_is_prose_never_used_for_training(tiny_tokenizer):
    texts = pydoc_prose()
    assert len(texts) > 50 and all(doc.startswith(f"{PYDOC_SOURCE}/") for doc in texts)
    for text in texts.values():
        assert "****" not in text and "::=" not in text  # no heading underlines, no grammar rules
    corpus = PydocProse(tiny_tokenizer)
    assert corpus.total_tokens > 20_000  # room for 4K-token haystacks at many offsets
    # The built-in prompts' standard-library reader skips the pydoc_data folder.
    assert not any("pydoc_data" in doc for doc in stdlib_documents())
    assert f"{STDLIB_SOURCE}/os.py" in stdlib_documents()


def test_pydoc_needles_sit_in_pydoc_text(tiny_corpus, tiny_tokenizer):
    samples = task(tiny_corpus, families=("date",), haystacks=("pydoc",), lengths=(300,)).samples(
        tiny_tokenizer
    )
    (sample,) = samples
    assert all(doc.startswith(PYDOC_SOURCE) for doc in sample.meta["docs"])
    assert sample.meta["haystack"] == "pydoc"


def test_default_haystacks_follow_the_distribution():
    assert NeedleFamilyTask(distribution="in").haystacks == ("essays",)
    assert NeedleFamilyTask(distribution="out").haystacks == ("essays", "pydoc")


def test_registry_and_family_table():
    assert TASKS["needle_families"] is NeedleFamilyTask
    assert set(IN_FAMILIES) <= {f for f, spec in FAMILIES.items() if spec.trained}
    assert not any(FAMILIES[f].trained for f in OUT_FAMILIES)


# --- training prompts keep out of the evaluation-only formats ------------------------------------------------


def test_training_prompts_never_contain_evaluation_only_facts_or_questions(tiny_corpus):
    essays, stdlib = tiny_corpus
    every_train = tuple(f.name for f in formats("train"))
    prompts = BuiltinPrompts(
        num_prompts=80,
        min_words=40,
        max_words=120,
        code_fraction=0.3,
        retrieval_fraction=0.6,
        heldout_fraction=FRACTION,
        essays_dir=str(essays),
        stdlib_dir=str(stdlib),
        fact_formats=every_train,
        family_weights={"summarize": 1, "quote": 1, "title": 1, "locate": 1, "review": 1, "keywords": 1},
    )
    texts = [p.messages[0]["content"] for p in prompts]
    eval_only = [f for f in FACT_FORMATS if f.side == "eval"]
    train_questions = {q for f in formats("train") for q in f.questions}
    for fmt in eval_only:
        for question in fmt.questions:
            if question in train_questions:
                continue
            assert not any(fixed_text(question) in text for text in texts), (fmt.name, question)
        if fmt.statement not in {f.statement for f in formats("train")}:
            assert not any(fixed_text(fmt.statement) in text for text in texts), fmt.name
    used = {f.name for f in formats("train") if any(fixed_text(f.statement) in t for t in texts)}
    assert used == set(every_train)  # every training format does occur


def test_evaluation_only_fact_formats_are_refused_for_training(tiny_corpus):
    with pytest.raises(ValueError, match=r"\['passphrase'\] are evaluation-only"):
        BuiltinPrompts(fact_formats=("magic_number", "passphrase"))


@pytest.mark.slow
def test_the_committed_full_evaluation_needles_are_drawn_again():
    """experiments/full_evidence/configs/full_evidence.yaml draws, sample for sample, the needles its committed
    rows were scored on (same haystack documents, depths and values): a change to a task's random draws would
    otherwise pair new prompts with old rows when a folder is resumed or copied (multi-needle families drew the
    window after the other needles' depths, and once briefly the other way round)."""
    import json
    from pathlib import Path

    import yaml

    from lkv.model.backbone import load_backbone

    root = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((root / "experiments/full_evidence/configs/full_evidence.yaml").read_text())
    committed = {
        (row["task"], row["sample"]): row
        for row in map(json.loads, (root / "experiments/full_evidence/results/results.jsonl").open())
        if row["method"] == "fullkv" and row["setting"] == "aware"
    }
    _, tokenizer = load_backbone("smollm2-135m")
    checked = 0
    for spec in config["tasks"]:
        if not spec["class_path"].endswith("NeedleFamilyTask"):
            continue
        needle_task = NeedleFamilyTask(**spec["init_args"])
        for sample in needle_task.samples(tokenizer):
            row = committed[(needle_task.name, sample.id)]
            assert sample.meta["docs"] == row["meta"]["docs"], sample.id
            assert sample.meta["depth"] == row["meta"]["depth"] and sample.answers == row["answers"], (
                sample.id
            )
            checked += 1
    assert checked == 60 + 84
