"""The product training mix (lkv.labels.task_mix): task kinds under their weights, facts planted once each over the
whole passage, only in-group sources and train-side kinds, prompts fixed by (seed, index)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from lkv.labels.facts import FACT_FORMATS, fact_format
from lkv.labels.gold import missed, reference_response
from lkv.labels.sources import HELDOUT_SOURCES, document_split
from lkv.labels.task_mix import TASKS, TaskMixPrompts

FACT_TASKS = ("doc_qa", "distractor", "few_shot")


@pytest.fixture
def roots(source_roots: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The two sources of ``source_roots`` and a standard-library tree of 60 modules (the code source)."""
    code = tmp_path / "stdlib"
    code.mkdir()
    for i in range(60):
        body = "".join(
            f"def step_{i}_{j}(value):\n    total = value * {j} + {i}\n    return total\n\n\n"
            for j in range(12)
        )
        (code / f"module_{i}.py").write_text(f'"""Module {i}."""\n\nimport math\n\n\n{body}')
    return {**source_roots, "python-stdlib": str(code)}


def make(roots: dict[str, str], **kwargs) -> TaskMixPrompts:
    settings = {
        "sources": ("chatterbot-dialogue", "debian-copyright"),
        "num_prompts": 60,
        "min_words": 40,
        "max_words": 400,
        "roots": roots,
    }
    return TaskMixPrompts(**{**settings, **kwargs})


def test_prompts_are_fixed_by_seed_and_index_and_a_longer_run_extends_a_shorter_one(roots):
    prompts = list(make(roots))
    again = list(make(roots))
    assert [(p.id, p.messages, p.meta) for p in prompts] == [(p.id, p.messages, p.meta) for p in again]
    longer = list(make(roots, num_prompts=80))
    assert [p.messages for p in longer[:60]] == [p.messages for p in prompts]
    assert make(roots, num_prompts=80).extends(make(roots).describe())
    assert not make(roots, seed=1).extends(make(roots).describe())
    assert [p.messages for p in make(roots, seed=1)] != [p.messages for p in prompts]


def test_every_asked_value_appears_once_and_distractors_of_one_kind_differ(roots):
    prompts = [p for p in make(roots, num_prompts=200) if p.kind in FACT_TASKS]
    assert {p.kind for p in prompts} == set(FACT_TASKS)
    asked_several = 0
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert content.endswith("\n\n" + prompt.meta["question"])
        answers = prompt.meta["answers"]
        assert prompt.answer == "; ".join(a["answer"] for a in answers)
        for item in answers:
            assert content.count(item["answer"]) == 1, (prompt.id, item["answer"])
            assert item["evidence"] in content and item["answer"] in item["evidence"]
            assert fact_format(item["format"]).side == "train"
        asked_several += len(answers) > 1
        if len(answers) == 1:
            assert prompt.meta["evidence"] == answers[0]["evidence"]
        if prompt.kind == "distractor":
            statement = fact_format(answers[0]["format"]).statement
            pattern = re.escape(statement).replace(r"\{key\}", r"(\w+)").replace(r"\{value\}", "(.+?)")
            planted = re.findall(pattern, content)
            assert len(planted) == prompt.meta["planted"] >= 2
            assert len({key for key, _ in planted}) == len({value for _, value in planted}) == len(planted)
        if prompt.kind == "few_shot":
            shots = prompt.meta["question"].split("\n\n")
            assert shots[-1].startswith("Q: ") and shots[-1].endswith("\nA:")
            assert sum(shot.startswith("Q: ") for shot in shots) == prompt.meta["planted"]
    assert asked_several > 10  # document questions ask several facts at once


def test_facts_are_planted_over_the_whole_passage(roots):
    prompts = make(roots, num_prompts=200, task_weights={"doc_qa": 1, "distractor": 1, "few_shot": 1})
    depths = [item["depth"] for p in prompts for item in p.meta["answers"]]
    assert min(depths) <= 0.05 and max(depths) >= 0.95
    assert 0.4 <= sum(depths) / len(depths) <= 0.6
    assert sum(d < 0.5 for d in depths) / len(depths) == pytest.approx(0.5, abs=0.1)


def test_task_kinds_appear_under_their_weights_from_their_sources(roots):
    weights = {"doc_qa": 0.4, "distractor": 0.1, "instruction": 0.2, "code": 0.3}
    prompts = list(make(roots, num_prompts=500, task_weights=weights))
    shares = Counter(p.kind for p in prompts)
    assert set(shares) == set(weights)  # few_shot has no weight
    for task, weight in weights.items():
        assert shares[task] / len(prompts) == pytest.approx(weight, abs=0.06), task
    for prompt in prompts:
        assert all(document_split(d) == "train" for d in prompt.meta["documents"])
        assert prompt.doc_id == prompt.meta["documents"][0]
        if prompt.kind == "code":
            assert prompt.source == "python-stdlib" and prompt.messages[0]["content"].startswith("```\n")
        else:
            assert prompt.source in ("chatterbot-dialogue", "debian-copyright")
        if prompt.kind in ("code", "instruction"):
            assert prompt.answer is None and prompt.meta["family"]


def test_passage_lengths_spread_over_the_word_range(roots):
    # the dialogue's conversations are two lines long: a passage runs on into the next ones
    prompts = list(make(roots, num_prompts=150, task_weights={"instruction": 1}))
    words = [p.meta["words"] for p in prompts]
    assert all(40 <= w <= 400 + 20 for w in words)
    assert min(words) < 80 and max(words) > 360
    assert max(len(p.meta["documents"]) for p in prompts if p.source == "chatterbot-dialogue") > 10


@pytest.mark.parametrize("name", HELDOUT_SOURCES)
def test_heldout_sources_are_refused(name):
    with pytest.raises(
        ValueError, match=rf"'{name}' is in the held-out group.*no training prompt may use it"
    ):
        TaskMixPrompts(sources=("paul-graham-essays", name))


def test_heldout_code_and_sources_that_are_not_code_are_refused_for_the_code_task():
    with pytest.raises(ValueError, match=r"'c-headers' is in the held-out group"):
        TaskMixPrompts(code_sources=("python-stdlib", "c-headers"))
    with pytest.raises(ValueError, match=r"code_sources: \['man-pages'\] are not code sources"):
        TaskMixPrompts(code_sources=("man-pages",))
    with pytest.raises(
        ValueError, match="code_sources must name a code source while task_weights gives 'code'"
    ):
        TaskMixPrompts(code_sources=())
    assert TaskMixPrompts(code_sources=(), task_weights={"doc_qa": 1}).code_sources == ()


@pytest.mark.parametrize("fmt", ["contact_name", "badge_code", "measurement", "passphrase"])
def test_heldout_and_evaluation_only_kinds_are_refused(fmt):
    with pytest.raises(ValueError, match=rf"fact_formats \['{fmt}'\] are evaluation-only"):
        TaskMixPrompts(fact_formats=("serial_code", fmt))


def test_bad_settings_are_refused_with_their_names():
    with pytest.raises(ValueError, match="unknown fact format 'badge_code_pair'"):
        TaskMixPrompts(fact_formats=("badge_code_pair",))
    with pytest.raises(ValueError, match=r"task_weights: unknown tasks \['chat'\]"):
        TaskMixPrompts(task_weights={"chat": 1})
    with pytest.raises(ValueError, match="task_weights: expected weights ≥ 0, one of them positive"):
        TaskMixPrompts(task_weights={"doc_qa": 0})
    with pytest.raises(ValueError, match="min_words ≤ max_words"):
        TaskMixPrompts(min_words=600, max_words=500)
    with pytest.raises(ValueError, match=r"max_facts must be in \[2, 20\]"):
        TaskMixPrompts(max_facts=1)
    assert set(TASKS) == {"doc_qa", "distractor", "instruction", "code", "few_shot"}


def test_gold_labelling_checks_and_states_every_asked_fact(roots, tiny_tokenizer):
    prompts = make(roots, num_prompts=100, task_weights={"doc_qa": 1})
    prompt = next(p for p in prompts if len(p.meta["answers"]) > 1)
    content = prompt.messages[0]["content"]
    answers = [a["answer"] for a in prompt.meta["answers"]]
    encode = tiny_tokenizer(" ".join(answers[:-1]), add_special_tokens=False).input_ids
    assert missed(prompt, encode, tiny_tokenizer)  # one asked fact unanswered
    every = tiny_tokenizer(" and ".join(answers), add_special_tokens=False).input_ids
    assert not missed(prompt, every, tiny_tokenizer)
    end = tiny_tokenizer.eos_token_id
    reference = reference_response(prompt, content, tiny_tokenizer, end, 512)
    evidence = " ".join(a["evidence"] for a in prompt.meta["answers"])
    assert reference == tiny_tokenizer(evidence, add_special_tokens=False).input_ids + [end]


def fixed_part(template: str) -> str:
    """The longest stretch of a statement or question template outside its ``{key}``/``{value}`` slots."""
    return max(re.split(r"\{key\}|\{value\}", template), key=len)


def test_no_prompt_holds_an_evaluation_only_or_heldout_statement_or_question(roots):
    texts = [p.messages[0]["content"] for p in make(roots, num_prompts=200)]
    train = [f for f in FACT_FORMATS if f.side == "train"]
    trained = {fixed_part(t) for f in train for t in (f.statement, *f.questions)}
    for fmt in (f for f in FACT_FORMATS if f.side != "train"):
        for template in (fmt.statement, *fmt.questions):
            if fixed_part(template) not in trained:  # the reworded magic number shares the training statement
                assert not any(fixed_part(template) in t for t in texts), (fmt.name, template)
    used = {f.name for f in train if any(fixed_part(f.statement) in t for t in texts)}
    assert used == {f.name for f in train}  # every train kind occurs, the ship names among them
