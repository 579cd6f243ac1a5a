"""The generalisation task: haystacks from a source's dev split, every fact kind's answer once in the prompt,
the measured distance exact on the tokenised prompt, FullKV screening, and the experiment's configs."""

import json
import re
from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

import lkv.commands.eval
from lkv.cli import main as lkv_main
from lkv.eval.tasks import TASKS, GeneraliseTask, ImportanceTask, NeedleTokenTask, encode_sample
from lkv.eval.tasks.generalise import KINDS, distance_bin
from lkv.labels.facts import fact_format
from lkv.labels.sources import BUILTIN_SOURCES, document_split
from tests.shipped_configs import is_fit_config

ROOT = Path(__file__).resolve().parents[2]
# the evals of the generalisation study (its fit configs are parsed by tests/train/test_configs.py) and of the
# pre-registered evaluation, which uses the same task
CONFIGS = [
    p
    for study in ("generalise", "preregistered")
    for p in sorted((ROOT / "experiments" / study / "configs").glob("*.yaml"))
    if not is_fit_config(p)
]


def task(roots, **kwargs) -> GeneraliseTask:
    settings = {
        "sources": tuple(roots),
        "samples_per_source": len(KINDS),
        "min_length": 150,
        "max_length": 400,
        "roots": roots,
    }
    return GeneraliseTask(**{**settings, **kwargs})


def write_screen(folder: Path, candidates: list, solved: set[str], meta: bool = False) -> None:
    """A FullKV screening run's ``results.jsonl`` in ``folder``: one row per candidate, solved as ``solved`` says
    (with each candidate's ``meta``, as `lkv eval` writes it, when ``meta``)."""
    rows = [
        {
            "task": "generalise",
            "sample": s.id,
            "method": "fullkv",
            "budget": "full",
            "setting": "aware",
            "score": float(s.id in solved),
            **({"meta": s.meta} if meta else {}),
        }
        for s in candidates
    ]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_measured_distance_is_the_token_distance_in_the_tokenised_prompt(source_roots, tiny_tokenizer):
    samples = task(source_roots).samples(tiny_tokenizer)
    assert len(samples) == 2 * len(KINDS) and TASKS["generalise"] is GeneraliseTask
    for sample in samples:
        context, question = encode_sample(sample, tiny_tokenizer)
        prompt = context + question
        value, distance = sample.answers[0], sample.meta["distance"]
        assert sample.meta["length"] == len(prompt)
        # the shortest prefix holding the whole value ends `distance` tokens before the prompt's end
        assert value in tiny_tokenizer.decode(prompt[: len(prompt) - distance])
        assert value not in tiny_tokenizer.decode(prompt[: len(prompt) - distance - 1])
        assert sample.meta["bin"] == distance_bin(distance)
    assert len({s.meta["distance"] for s in samples}) > len(samples) // 2  # drawn, not a grid


def test_every_kind_plants_its_answer_once_and_a_distractor_of_the_same_shape(source_roots, tiny_tokenizer):
    samples = task(source_roots).samples(tiny_tokenizer)
    assert {s.meta["kind"] for s in samples} == set(KINDS)
    for sample in samples:
        kind = KINDS[sample.meta["kind"]]
        fmt = fact_format(kind.format)
        (value,) = sample.answers
        prompt = sample.context + sample.question
        assert prompt.count(value) == 1 and value not in sample.question
        keys, values = sample.meta["keys"], sample.meta["values"]
        assert len(keys) == len(set(keys)) == len(set(values)) == 1 + kind.distractors and values[0] == value
        for key, planted in zip(keys, values, strict=True):
            # each fact once, in the format's statement; a distractor has another key and another value
            assert sample.context.count(fmt.statement.format(key=key, value=planted)) == 1
            assert prompt.count(planted) == 1
        assert re.search(rf"\b{keys[0]}\b", sample.question)
        assert not any(re.search(rf"\b{key}\b", sample.question) for key in keys[1:])
        assert sample.meta["kind_side"] == fmt.side
        assert task(source_roots).score(f"It is {value}.", sample) == {"string_match": 1.0}
        assert task(source_roots).score("I do not know.", sample) == {"string_match": 0.0}


def test_haystacks_come_from_the_chosen_split_and_rows_name_their_source(source_roots, tiny_tokenizer):
    for split in ("dev", "heldout"):
        samples = task(source_roots, split=split).samples(tiny_tokenizer)
        for sample in samples:
            assert sample.meta["split"] == split and sample.id.startswith(
                f"generalise-{sample.meta['source']}"
            )
            assert all(document_split(doc) == split for doc in sample.meta["docs"])
            assert 150 <= sample.meta["target_length"] <= 400
        groups = {s.meta["source"]: s.meta["source_group"] for s in samples}
        assert groups == {"chatterbot-dialogue": "in-source", "debian-copyright": "in-source"}
        for sample in samples:  # a line source writes the fact as a line of its own (a speaker's turn here)
            fmt = fact_format(KINDS[sample.meta["kind"]].format)
            statement = fmt.statement.format(key=sample.meta["keys"][0], value=sample.answers[0])
            line = sample.meta["source"] == "chatterbot-dialogue"
            assert (f"A: {statement}\n" in sample.context) == line
    again = task(source_roots).samples(tiny_tokenizer)
    assert [(s.id, s.context) for s in again] == [
        (s.id, s.context) for s in task(source_roots).samples(tiny_tokenizer)
    ]


def test_your_own_documents_are_a_source_of_their_own_group(tmp_path, tiny_tokenizer):
    root = tmp_path / "mine"
    root.mkdir()
    for i in range(120):  # ~12 on the dev split
        (root / f"memo{i}.md").write_text(
            f"# Memo {i}\n\n" + " ".join(f"Memo {i} item {j} covers the harbour plan." for j in range(30))
        )
    samples = task({"text-folder": str(root)}).samples(tiny_tokenizer)
    assert len(samples) == len(KINDS)
    assert {(s.meta["source"], s.meta["source_group"]) for s in samples} == {("text-folder", "user")}
    assert all(
        document_split(doc) == "dev" and doc.startswith("text-folder/memo")
        for s in samples
        for doc in s.meta["docs"]
    )
    # the default sources are the ones this machine ships: a folder of your own is named, never assumed
    assert GeneraliseTask().sources == BUILTIN_SOURCES
    with pytest.raises(ValueError, match=r"text-folder reads your own documents"):
        GeneraliseTask(sources=("text-folder",)).samples(tiny_tokenizer)


def test_screening_keeps_the_first_candidates_fullkv_solved(source_roots, tiny_tokenizer, tmp_path):
    candidates = task(source_roots, samples_per_source=2, oversample=3).samples(tiny_tokenizer)
    assert len(candidates) == 12
    solved = {s.id for i, s in enumerate(candidates) if i % 3 != 1}
    write_screen(tmp_path, candidates, solved)
    screened = task(source_roots, samples_per_source=2, oversample=3, screened_by=str(tmp_path)).samples(
        tiny_tokenizer
    )
    by_source = {}
    for sample in candidates:
        if sample.id in solved:
            by_source.setdefault(sample.meta["source"], []).append(sample.id)
    assert [s.id for s in screened] == [i for ids in by_source.values() for i in ids[:2]]
    with pytest.raises(
        ValueError, match=r"screened_by .*: no FullKV row of task 'generalise' \(agnostic\) to screen by"
    ):
        task(source_roots, screened_by=str(tmp_path), screen_setting="agnostic").samples(tiny_tokenizer)
    with pytest.raises(FileNotFoundError, match=r"screened_by: no results.jsonl"):
        task(source_roots, screened_by=str(tmp_path / "nothing")).samples(tiny_tokenizer)


def test_a_screen_row_of_another_prompt_under_the_same_id_is_refused(source_roots, tiny_tokenizer, tmp_path):
    """A source's files changed since the screen: the id now builds another haystack, so its outcome is refused."""
    candidates = task(source_roots, samples_per_source=2, oversample=2).samples(tiny_tokenizer)
    write_screen(tmp_path, candidates, {s.id for s in candidates}, meta=True)
    again = task(source_roots, samples_per_source=2, oversample=2, screened_by=str(tmp_path)).samples(
        tiny_tokenizer
    )
    assert len(again) == 2 * len(source_roots)  # the same prompts: accepted
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["meta"]["docs"], row["meta"]["length"] = ["elsewhere/gone.txt"], row["meta"]["length"] + 7
    (tmp_path / "results.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    with pytest.raises(
        ValueError,
        match=rf"screened_by {tmp_path}: 1 sample\(s\) of task 'generalise' now build "
        rf"other prompts .*{row['sample']} \(meta differs in: docs, length\)",
    ):
        task(source_roots, samples_per_source=2, oversample=2, screened_by=str(tmp_path)).samples(
            tiny_tokenizer
        )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"split": "train"}, r"split must be 'dev' or 'heldout' \(never a source's train documents\)"),
        ({"sources": ("essays",)}, r"sources: unknown text sources \['essays'\]"),
        ({"kinds": ("nope",)}, r"kinds: unknown fact kinds \['nope'\]"),
        ({"min_length": 500, "max_length": 100}, r"need 0 < min_length ≤ max_length"),
        ({"roots": {"nope": "/x"}}, r"roots: unknown text sources \['nope'\]"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        GeneraliseTask(**settings)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_experiment_configs_parse_and_build_the_task(path, capsys):
    assert any(
        f"lkv eval --config {path.relative_to(ROOT)}" in line for line in path.read_text().splitlines()
    )
    with pytest.raises(SystemExit) as exit_info:
        lkv_main(["eval", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert yaml.safe_load(capsys.readouterr().out)["tasks"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(lkv.commands.eval.evaluate)
    built = parser.instantiate(parser.parse_args(["--config", str(path)]))
    # the needle-token diagnostic wraps the same task: its rows pair by sample with the end-task rows; the
    # recall configs score the held-out labels every fit validates on
    needles = [t.needles if isinstance(t, NeedleTokenTask) else t for t in built.tasks]
    expected = ImportanceTask if path.stem.startswith("recall") else GeneraliseTask
    assert [type(t) for t in needles] == [expected]


def test_the_experiment_has_both_configs():
    assert {f"{p.parent.parent.name}/{p.stem}" for p in CONFIGS} == {
        "generalise/screen",
        "generalise/screen_oos",
        "generalise/dev",
        "generalise/dev_mix",
        "generalise/dev_mix_sentences128",
        "generalise/dev_oos",
        "generalise/dev_oos_mix",
        "generalise/dev_tokens",
        "generalise/full",
        "generalise/full_in",
        "generalise/levers",
        "generalise/recall",
        "generalise/recall_probe",
        "generalise/user_nodejs",
        "generalise/user_vim",
        "preregistered/screen",
        "preregistered/screen_extension",
        "preregistered/eval",
    }


def test_bin_caps_keep_the_first_solved_candidates_of_each_named_bin(source_roots, tiny_tokenizer, tmp_path):
    candidates = task(
        source_roots, samples_per_source=4, oversample=2, min_length=150, max_length=1600
    ).samples(tiny_tokenizer)
    solved = {s.id for i, s in enumerate(candidates) if i % 4 != 3}
    write_screen(tmp_path, candidates, solved)
    caps = {"near": 2, "far": 1}
    screened = task(
        source_roots,
        samples_per_source=4,
        oversample=2,
        min_length=150,
        max_length=1600,
        screened_by=str(tmp_path),
        bin_caps=caps,
    ).samples(tiny_tokenizer)
    expected = []
    for source in source_roots:
        taken = dict.fromkeys(caps, 0)
        for s in candidates:
            b = s.meta["bin"]
            if s.meta["source"] == source and s.id in solved and b in caps and taken[b] < caps[b]:
                taken[b] += 1
                expected.append(s.id)
    assert [s.id for s in screened] == expected
    assert any(s.meta["bin"] == "near" for s in screened) and all(s.meta["bin"] != "mid" for s in screened)
    with pytest.raises(
        ValueError, match="bin_caps: caps solved candidates per distance bin; give screened_by"
    ):
        task(source_roots, bin_caps=caps)
    with pytest.raises(ValueError, match=r"bin_caps: expected positive counts for bins among far, mid, near"):
        task(source_roots, screened_by=str(tmp_path), bin_caps={"distant": 3})


def test_a_larger_screen_starts_with_the_smaller_screens_candidates(source_roots, tiny_tokenizer):
    """Growing samples_per_source keeps every earlier candidate as it was (id, prompt, answer), so a grown
    screen (experiments/generalise/configs/screen_oos.yaml) resumes in the folder of the smaller one."""
    small = task(source_roots, samples_per_source=2, oversample=3).samples(tiny_tokenizer)
    grown = task(source_roots, samples_per_source=4, oversample=3).samples(tiny_tokenizer)
    by_id = {s.id: s for s in grown}
    assert len(grown) == 2 * len(small) and all(s.id in by_id for s in small)
    for s in small:
        g = by_id[s.id]
        assert (g.context, g.question, g.answers, g.meta) == (s.context, s.question, s.answers, s.meta)
