"""Task generators and LongBench: needle depth, answers recoverable from the context, held-out documents only,
the official LongBench prompts/truncation/metrics on a handwritten fixture."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from lkv.eval.tasks import (
    TASKS,
    CodeCompletionTask,
    CodeLookupTask,
    FidelityTask,
    LongBenchTask,
    NeedleTask,
    RulerTask,
    encode_sample,
    make_task,
)
from lkv.eval.tasks.longbench import PROMPTS, load_records, split_prompt
from lkv.eval.tasks.ruler import NIAH_VARIANTS
from lkv.eval.tasks.text import HeldoutEssays, SplitUnits, rng_for, source_haystack, split_sentences
from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.prompts import essay_documents, split_by_document, stdlib_documents
from lkv.labels.sources import Document, TextSource, make_source
from tests.conftest import ESSAYS

FIXTURE = Path(__file__).parents[1] / "fixtures" / "longbench"
# With four essays, 0.5 holds out beta and gamma and trains on alpha and delta (a hash split).
FRACTION = 0.5


@pytest.fixture
def corpus(tiny_corpus) -> tuple[str, str]:
    essays, stdlib = tiny_corpus
    return str(essays), str(stdlib)


def heldout_and_train(corpus) -> tuple[set[str], set[str]]:
    train, heldout = split_by_document(list(essay_documents(corpus[0])), FRACTION)
    assert train and heldout
    return heldout, train


def test_registry_builds_every_task():
    assert set(TASKS) == {
        "niah",
        "needle_families",
        "needle_tokens",
        "ruler",
        "code",
        "code_lookup",
        "generalise",
        "fidelity",
        "importance",
        "longbench",
        "multi_question",
    }
    assert isinstance(make_task("niah", lengths=[64]), NeedleTask)
    with pytest.raises(ValueError, match="unknown benchmark"):
        make_task("nope")


def test_split_sentences_handles_lost_paragraph_breaks():
    assert split_sentences("It grew.We left! Did  it? Yes") == ["It grew.", "We left!", "Did it?", "Yes"]


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_needle_sits_at_the_requested_depth(corpus, tiny_tokenizer, depth):
    task = NeedleTask(lengths=(400,), depths=(depth,), essays_dir=corpus[0], heldout_fraction=FRACTION)
    (sample,) = task.samples(tiny_tokenizer)
    value = sample.answers[0]
    needle = next(s for s in split_sentences(sample.context) if value in s)
    haystack = sample.context.split("\n", 1)[1]  # drop the instruction line
    before, after = haystack.split(needle)
    count = lambda text: len(tiny_tokenizer(text.strip(), add_special_tokens=False)["input_ids"])  # noqa: E731
    longest = max(count(s) for s in split_sentences(haystack))
    measured = count(before) / (count(before) + count(after))
    # The needle goes to the sentence boundary nearest the depth: at most half a sentence (+ rounding) off.
    assert abs(measured - depth) <= (longest / 2 + 2) / (count(before) + count(after))
    assert sample.meta == {"length": 400, "depth": depth, "docs": sample.meta["docs"]}


def test_needle_answer_is_recoverable(corpus, tiny_tokenizer):
    task = NeedleTask(
        lengths=(200, 300), depths=(0.3,), samples_per_cell=2, essays_dir=corpus[0], heldout_fraction=FRACTION
    )
    samples = task.samples(tiny_tokenizer)
    assert len({s.id for s in samples}) == 4
    for sample in samples:
        value = sample.answers[0]
        key = re.search(r"for (\S+) mentioned", sample.question).group(1)
        assert sample.context.count(value) == 1
        assert f"One of the special magic numbers for {key} is: {value}." in sample.context
        assert task.score(f"It is {value}.", sample) == {"string_match": 1.0}
        assert task.score("It is 42.", sample) == {"string_match": 0.0}
        # The haystack without the needle fills the requested length to within half a sentence.
        haystack = sample.context.split("\n", 1)[1].replace(
            f"One of the special magic numbers for {key} is: {value}.", ""
        )
        tokens = len(tiny_tokenizer(haystack.strip(), add_special_tokens=False)["input_ids"])
        longest = max(
            len(tiny_tokenizer(x, add_special_tokens=False)["input_ids"]) for x in split_sentences(haystack)
        )
        assert abs(tokens - sample.meta["length"]) <= longest / 2 + 2
        context, question = encode_sample(sample, tiny_tokenizer)
        assert tiny_tokenizer.decode(context + question).endswith(
            sample.question + "<|im_end|>\n<|im_start|>assistant\n" + sample.answer_prefix
        )


def test_needle_samples_are_deterministic(corpus, tiny_tokenizer):
    task = NeedleTask(lengths=(200,), depths=(0.5,), essays_dir=corpus[0], heldout_fraction=FRACTION)
    assert task.samples(tiny_tokenizer) == task.samples(tiny_tokenizer)


def test_generated_tasks_use_heldout_documents_only(corpus, tiny_tokenizer):
    heldout, train = heldout_and_train(corpus)
    code_train, code_heldout = split_by_document(list(stdlib_documents(corpus[1])), FRACTION)
    samples = NeedleTask(
        lengths=(200,), depths=(0.2, 0.8), samples_per_cell=3, essays_dir=corpus[0], heldout_fraction=FRACTION
    ).samples(tiny_tokenizer)
    samples += FidelityTask(
        lengths=(150,), num_samples=4, essays_dir=corpus[0], heldout_fraction=FRACTION
    ).samples(tiny_tokenizer)
    samples += RulerTask(
        "niah_multikey_1", lengths=(300,), num_samples=3, essays_dir=corpus[0], heldout_fraction=FRACTION
    ).samples(tiny_tokenizer)
    used = {doc for s in samples for doc in s.meta["docs"]}
    assert used and used <= heldout and not used & train
    # No training essay's text reaches any context (each tiny essay repeats one distinctive paragraph).
    for name in (doc.split("/")[1] for doc in train):
        first_sentence = split_sentences(ESSAYS[name])[1]
        assert all(first_sentence not in s.context for s in samples)
    code = CodeCompletionTask(
        lengths=(40,), num_samples=3, min_line_chars=8, stdlib_dir=corpus[1], heldout_fraction=FRACTION
    )
    code_docs = {doc for s in code.samples(tiny_tokenizer) for doc in s.meta["docs"]}
    assert code_docs and code_docs <= code_heldout and not code_docs & code_train
    # The training prompts draw from exactly the other side of the same split.
    prompts = BuiltinPrompts(
        split="train",
        num_prompts=20,
        min_words=20,
        max_words=40,
        essays_dir=corpus[0],
        stdlib_dir=corpus[1],
        heldout_fraction=FRACTION,
    )
    assert {p.doc_id for p in prompts}.isdisjoint(used | code_docs)


def test_heldout_essays_refuse_an_empty_split(corpus, tiny_tokenizer):
    with pytest.raises(ValueError, match="no held-out essay"):
        HeldoutEssays(tiny_tokenizer, corpus[0], heldout_fraction=0.0)


@pytest.mark.parametrize("name", ["chatterbot-dialogue", "debian-copyright"])
def test_a_split_reads_each_document_once_however_often_it_is_drawn(
    source_roots, tiny_tokenizer, name, monkeypatch
):
    """Haystacks drawn from one :class:`SplitUnits` read each document once and equal those of fresh ones."""
    reads: Counter[str] = Counter()
    read = TextSource.document

    def counted(source: TextSource, doc_id: str) -> Document:
        reads[doc_id] += 1
        return read(source, doc_id)

    monkeypatch.setattr(TextSource, "document", counted)
    source = make_source(name, source_roots[name])
    documents = SplitUnits(source, "heldout")
    # more tokens than the split holds: each draw takes every document of the split
    windows = [source_haystack(documents, tiny_tokenizer, 10**6, rng_for("draw", i)) for i in range(2)]
    assert {u.doc_id for u in windows[1]} == set(documents.doc_ids) and set(reads.values()) == {1}
    again = [source_haystack(documents, tiny_tokenizer, 300, rng_for("draw", i)) for i in range(3)]
    assert set(reads.values()) == {1}
    fresh = [
        source_haystack(SplitUnits(source, "heldout"), tiny_tokenizer, 300, rng_for("draw", i))
        for i in range(3)
    ]
    assert again == fresh and sum(reads.values()) > len(documents.doc_ids)  # fresh ones read again


@pytest.mark.parametrize("name", sorted(NIAH_VARIANTS))
def test_ruler_needles_are_recoverable(corpus, tiny_tokenizer, name):
    task = RulerTask(name, lengths=(400,), num_samples=2, essays_dir=corpus[0], heldout_fraction=FRACTION)
    for sample in task.samples(tiny_tokenizer):
        spec = NIAH_VARIANTS[name]
        assert len(sample.answers) == spec.num_values * spec.num_queries
        for value in sample.answers:
            assert sample.context.count(value) == 1
            key = re.search(rf"for (\S+) is: {re.escape(value)}\.", sample.context).group(1)
            assert key in sample.question and key in sample.answer_prefix
        assert task.score(" ".join(sample.answers), sample)["string_match"] == 1.0
        singular = spec.num_values * spec.num_queries == 1
        assert sample.question.startswith("What is the" if singular else "What are all the")


def test_variable_tracking_chain_resolves_to_the_answers(corpus, tiny_tokenizer):
    task = RulerTask(
        "vt", lengths=(300,), num_samples=2, num_hops=3, essays_dir=corpus[0], heldout_fraction=FRACTION
    )
    for sample in task.samples(tiny_tokenizer):
        values: dict[str, str] = {}
        for name, rhs in re.findall(r"VAR (\w+) = (VAR \w+|\d+)", sample.context):
            values[name] = values[rhs[4:]] if rhs.startswith("VAR ") else rhs
        query = re.search(r"the value (\d+) in the text", sample.question).group(1)
        assert sorted(n for n, v in values.items() if v == query) == sorted(sample.answers)
        assert len(sample.answers) == 4


def test_common_and_frequent_words_answers_are_the_most_frequent(corpus, tiny_tokenizer):
    cwe = RulerTask(
        "cwe",
        lengths=(600,),
        num_samples=1,
        num_cw=3,
        freq_cw=6,
        freq_ucw=2,
        essays_dir=corpus[0],
        heldout_fraction=FRACTION,
    )
    (sample,) = cwe.samples(tiny_tokenizer)
    words = Counter(re.findall(r"\d+\. (\w+)", sample.context))
    assert {w for w, c in words.items() if c == 6} == set(sample.answers) and len(sample.answers) == 3
    assert max(c for w, c in words.items() if w not in sample.answers) == 2
    fwe = RulerTask("fwe", lengths=(600,), num_samples=1, essays_dir=corpus[0], heldout_fraction=FRACTION)
    (sample,) = fwe.samples(tiny_tokenizer)
    coded = Counter(sample.context.split("coded words. ", 1)[1].split())
    top = [w for w, _ in coded.most_common(4)]
    assert top[0] == "...." and top[1:] == sample.answers


def test_code_completion_target_is_the_next_line(corpus, tiny_tokenizer):
    task = CodeCompletionTask(
        lengths=(60,), num_samples=3, min_line_chars=8, stdlib_dir=corpus[1], heldout_fraction=FRACTION
    )
    files = stdlib_documents(corpus[1])
    for sample in task.samples(tiny_tokenizer):
        assert not sample.chat and sample.question == "Next line of code:\n"
        source = files[sample.meta["docs"][0]].read_text()
        code = sample.context.removeprefix("Please complete the code given below. \n")
        lines = source.splitlines(keepends=True)
        target = sample.meta["line"] - 1
        assert source.find(code + lines[target]) >= 0
        assert lines[target].strip() == sample.answers[0]
        assert task.score(f"{sample.answers[0]}\nmore", sample) == {"edit_sim": 1.0, "exact_match": 1.0}


def test_fidelity_scores_against_the_reference(corpus, tiny_tokenizer):
    task = FidelityTask(lengths=(150,), num_samples=2, essays_dir=corpus[0], heldout_fraction=FRACTION)
    sample = task.samples(tiny_tokenizer)[0]
    assert task.score("the cat sat", sample, reference="the cat sat") == {"rouge_l": 1.0, "token_f1": 1.0}
    with pytest.raises(ValueError, match="FullKV answer"):
        task.score("x", sample)


# --- LongBench ---------------------------------------------------------------------------------------------


def test_longbench_has_the_16_english_tasks_with_context_before_the_question():
    assert len(PROMPTS) == 16
    for dataset in PROMPTS:
        head, tail = split_prompt(dataset)
        assert head.endswith("{context}") and "{context}" not in tail and "{input}" not in head


def test_longbench_loader_builds_the_official_prompts(tiny_tokenizer):
    task = LongBenchTask("hotpotqa", data_dir=str(FIXTURE), max_length=10_000)
    samples = task.samples(tiny_tokenizer)
    records = [json.loads(line) for line in (FIXTURE / "hotpotqa.jsonl").read_text().splitlines()]
    assert [s.id for s in samples] == ["hotpotqa-hp-001", "hotpotqa-hp-002"]
    for sample, record in zip(samples, records, strict=True):
        official = PROMPTS["hotpotqa"].format(context=record["context"], input=record["input"])
        assert sample.context + sample.question == official
        assert sample.chat and sample.max_new_tokens == 32 and sample.answers == record["answers"]
    lcc = LongBenchTask("lcc", data_dir=str(FIXTURE)).samples(tiny_tokenizer)[0]
    assert not lcc.chat and lcc.question == "Next line of code:\n" and lcc.max_new_tokens == 64


def test_longbench_truncates_the_middle_of_the_context(tiny_tokenizer):
    full = LongBenchTask("lcc", data_dir=str(FIXTURE), max_length=10_000).samples(tiny_tokenizer)[0]
    short = LongBenchTask("lcc", data_dir=str(FIXTURE), max_length=60).samples(tiny_tokenizer)[0]
    count = lambda text: len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert count(full.context + full.question) > 60
    assert short.question == full.question
    assert abs(count(short.context) + count(short.question) - 60) <= 3  # decode/re-encode merges a few
    head = tiny_tokenizer.decode(tiny_tokenizer(full.context, add_special_tokens=False)["input_ids"][:30])
    assert short.context.startswith(head)
    assert len(short.context) > len(head) and full.context.endswith(short.context[len(head) :])


@pytest.mark.parametrize(
    ("dataset", "prediction", "expected"),
    [
        ("hotpotqa", "the Douro River", 1.0),  # second row: best over its two answers ("the douro river")
        ("trec", "Individual\nCity", 1.0),  # first line only
        ("trec", "City or Individual", 0.5),
        ("passage_retrieval_en", "Paragraph 2", 1.0),
        ("passage_count", "2 or 3", 0.5),
        ("lcc", "    return result\n", 1.0),
        ("samsum", "Ann and Bob will have lunch at noon.", 1.0),
    ],
)
def test_longbench_scores_with_the_official_metric(tiny_tokenizer, dataset, prediction, expected):
    task = LongBenchTask(dataset, data_dir=str(FIXTURE))
    sample = task.samples(tiny_tokenizer)[-1]
    (value,) = task.score(prediction, sample).values()
    assert value == pytest.approx(expected)


def test_longbench_reports_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="qasper.jsonl"):
        load_records("qasper", str(tmp_path))
    (tmp_path / "qasper.jsonl").write_text('{"input": "q", "context": 3, "answers": []}\n')
    with pytest.raises(ValueError, match=r"qasper.jsonl:1: field 'context' must be str, found int"):
        load_records("qasper", str(tmp_path))
    with pytest.raises(ValueError, match="unknown LongBench task"):
        LongBenchTask("dureader")


def test_code_lookup_asks_for_a_number_assigned_once_in_its_window(tmp_path, tiny_tokenizer):
    module = "".join(
        f"LIMIT_{i} = {1000 + i}\nNAME_{i} = 'item{i}'\n\n\ndef f{i}(x):\n    total = x + LIMIT_{i}\n    return total\n\n\n"
        for i in range(40)
    )
    (tmp_path / "consts.py").write_text(module)
    task = CodeLookupTask(
        lengths=(80,), depths=(0.2, 0.8), samples_per_cell=3, stdlib_dir=str(tmp_path), heldout_fraction=1.0
    )
    samples = task.samples(tiny_tokenizer)
    assert len({s.id for s in samples}) == 6
    for sample in samples:
        code = sample.context.removeprefix("```python\n").removesuffix("```\n\n")
        assert code in module
        value = sample.answers[0]
        name = re.search(r"`(\w+)`", sample.question).group(1)
        assert f"{name} = {value}\n" in code and code.count(f"{name} = ") == 1
        assert value.isdigit()  # numbers only: the string constants NAME_i are never asked for
        assert sample.answer_prefix == f"`{name} = " and sample.stop == ("`", "\n")
        for completion in (value, f" {value}"):
            assert task.score(completion, sample) == {"exact_match": 1.0}
        for completion in ("7", f"{value}0", f"x = {value}", f'"{value}"'):
            assert task.score(completion, sample) == {"exact_match": 0.0}
        tokens = len(tiny_tokenizer(code, add_special_tokens=False)["input_ids"])
        assert 0.8 * 80 <= tokens <= 84  # counted line by line; joined lines tokenise a little shorter
    assert task.samples(tiny_tokenizer) == samples  # deterministic
