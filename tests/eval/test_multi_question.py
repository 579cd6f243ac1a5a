"""Multi-question tasks: the task's contexts and facts, one compression per (context, method, budget) that
every question is asked from, each answer equal to asking that question alone, and the per-context rows of
the report."""

import pytest
import torch

import lkv.commands.eval
import lkv.commands.eval_run
import lkv.eval.run_multi_question
from lkv.core.generation import Sampling
from lkv.core.importance import response_importance
from lkv.eval.all_answered import all_answered_rows
from lkv.eval.prefill import shared_prefill
from lkv.eval.report import write_report
from lkv.eval.run_multi_question import contexts_of
from lkv.eval.runner import Evaluator
from lkv.eval.tasks import TASKS, MultiQuestionTask, encode_sample
from lkv.eval.tasks.multi_question import FACT_KINDS, NEEDLE_KINDS
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress, OraclePress
from lkv.eviction.registry import make_method
from lkv.labels.sources import document_split
from tests.conftest import TINY_HELDOUT

BUDGETS = [8, 16]


def tiny_task(corpus, **kwargs) -> MultiQuestionTask:
    settings = {
        "lengths": (400,),
        "questions": 4,
        "num_samples": 2,
        "answer_slack": 2,
        "essays_dir": str(corpus[0]),
        "heldout_fraction": TINY_HELDOUT,
    }
    return MultiQuestionTask(**{**settings, **kwargs})


def presses() -> dict:
    return {
        "fullkv": FullKVPress(),
        "oracle": OraclePress(),
        "snapkv": make_method("snapkv", window=4),
        "streamingllm": make_method("streamingllm"),
        "h2o-decode": make_method("h2o-decode", every=1),
    }


def test_a_context_holds_its_questions_facts_at_spread_depths(tiny_corpus, tiny_llama):
    _, tokenizer = tiny_llama
    task = tiny_task(tiny_corpus, lengths=(900,), kinds=FACT_KINDS, num_samples=3)
    assert TASKS["multi_question"] is MultiQuestionTask
    samples = task.samples(tokenizer)
    groups = contexts_of(samples)
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    kinds = [s.meta["fact_kind"] for s in samples]
    assert kinds == [FACT_KINDS[i % len(FACT_KINDS)] for i in range(12)]  # cycled over the contexts
    for group in groups:
        context = group[0].context
        assert [s.meta["question_index"] for s in group] == [0, 1, 2, 3]
        # one fact per depth stratum of the context
        assert sorted(int(s.meta["depth"] * 4) for s in group) == [0, 1, 2, 3]
        context_len = len(encode_sample(group[0], tokenizer)[0])
        by_depth = sorted(group, key=lambda s: s.meta["depth"])
        distances = [s.meta["distance"] for s in by_depth]
        assert (
            distances == sorted(distances, reverse=True) and 0 <= distances[-1] < distances[0] < context_len
        )
        for sample in group:
            assert all(answer in context for answer in sample.answers)
            assert len({s.question for s in group}) == 4
    assert [s.id for s in samples] == [s.id for s in task.samples(tokenizer)]  # stable across runs


def test_a_text_source_gives_the_haystacks_of_its_split_and_names_itself(source_roots, tiny_tokenizer):
    """Sources instead of the essays: a source's contexts draw only on its split's documents, plant each fact
    as one of its units (a line source's turn) and carry its name in their ids and rows."""
    task = MultiQuestionTask(
        lengths=(300,), num_samples=2, kinds=FACT_KINDS, sources=tuple(source_roots), roots=source_roots
    )
    samples = task.samples(tiny_tokenizer)
    assert len(contexts_of(samples)) == 2 * len(source_roots)  # per source and length, num_samples contexts
    for sample in samples:
        source = sample.meta["source"]
        assert sample.meta["split"] == "heldout" and sample.meta["source_group"] == "in-source"
        assert sample.meta["context_id"].startswith(f"multi_question-{source}-heldout-L300-k4-s0-")
        assert all(document_split(doc) == "heldout" for doc in sample.meta["docs"])
        assert all(answer in sample.context for answer in sample.answers)
    for group in contexts_of(samples):
        assert sorted(int(s.meta["depth"] * 4) for s in group) == [0, 1, 2, 3]
    for sample in (s for s in samples if s.meta["fact_kind"] in NEEDLE_KINDS):
        # a line source writes the fact as a line of its own (a speaker's turn); a sentence source as a sentence
        (line,) = [line for line in sample.context.splitlines() if sample.answers[0] in line]
        assert line.startswith("A: ") == (sample.meta["source"] == "chatterbot-dialogue"), line
    dev = MultiQuestionTask(
        lengths=(300,), num_samples=2, sources=tuple(source_roots), roots=source_roots, split="dev"
    )
    assert all(document_split(d) == "dev" for s in dev.samples(tiny_tokenizer) for d in s.meta["docs"])
    assert [(s.id, s.context) for s in samples] == [(s.id, s.context) for s in task.samples(tiny_tokenizer)]


def test_the_essays_contexts_do_not_name_a_source(tiny_corpus, tiny_tokenizer):
    """Without sources the ids and rows stay the essays' own (rows scored before sources existed still match)."""
    sample = tiny_task(tiny_corpus, num_samples=1).samples(tiny_tokenizer)[0]
    assert sample.id == "multi_question-L400-k4-s0-0-q0" and "source" not in sample.meta


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"questions": 1}, "at least 2"),
        ({"kinds": ("colour",)}, "unknown fact kinds"),
        ({"sources": ()}, "name at least one text source"),
        ({"sources": ("novels",)}, r"unknown text sources \['novels'\]"),
        ({"sources": ("pydoc-topics",), "split": "train"}, "never a source's train documents"),
        ({"roots": {"nope": "/x"}}, r"roots: unknown text sources \['nope'\]"),
    ],
)
def test_bad_settings_are_refused(tiny_corpus, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_task(tiny_corpus, **kwargs)


def test_a_split_too_small_for_a_context_is_refused(source_roots, tiny_tokenizer):
    task = MultiQuestionTask(
        lengths=(10**6,), num_samples=1, sources=("debian-copyright",), roots=source_roots
    )
    with pytest.raises(ValueError, match="debian-copyright: its 'heldout' split holds fewer than"):
        task.samples(tiny_tokenizer)


def lookahead_press(model):
    """A LookaheadKV press of a random (perturbed) 3-token module injected in ``model``."""
    from lkv.eviction.presses import LookaheadKVPress
    from lkv.model.lookahead import LookaheadAdapter
    from tests.model.test_lookahead import perturb_lora

    adapter = LookaheadAdapter.create(model, num_tokens=3, seed=1)
    perturb_lora(adapter, seed=1)
    return LookaheadKVPress(adapter)


@pytest.mark.parametrize("kind", ["baselines", "lookaheadkv"])
def test_each_answer_equals_compressing_once_and_asking_that_question_alone(
    tiny_llama, tiny_corpus, tmp_path, kind
):
    model, tokenizer = tiny_llama
    task = tiny_task(tiny_corpus)
    if kind == "baselines":
        more = {"kvzip": make_method("kvzip"), "expected_attention": make_method("expected_attention")}
        methods = {**presses(), **more}
    else:
        methods = {"fullkv": FullKVPress(), "lookaheadkv": lookahead_press(model)}
        model = methods["lookaheadkv"].base_model
    rows = Evaluator(model, tokenizer, methods, BUDGETS, ["agnostic"], tmp_path, progress=False).run([task])
    samples = {s.id: s for s in task.samples(tokenizer)}
    assert len(rows) == len(samples) * (1 + (len(methods) - 1) * len(BUDGETS))  # FullKV; the others × budgets
    for row in rows:
        sample = samples[row["sample"]]
        context, question = encode_sample(sample, tokenizer)
        sampling = Sampling(sample.max_new_tokens)
        assert row["meta"]["context_id"] == sample.meta["context_id"] and row["setting"] == "agnostic"
        if row["method"] == "oracle":
            continue  # its scores need every question's FullKV answer: test_the_oracle_...
        if row["method"] == "fullkv":  # a FullKV run of context + question, prefilled in one go
            full = Compressor(model, tokenizer, FullKVPress())
            expected = full.decode(full.compress(context + question), sampling)
        else:
            compressor = Compressor(model, tokenizer, methods[row["method"]], budget=int(row["budget"]))
            expected = compressor.answer(compressor.compress(context), question, sampling)
        assert row["answer_ids"] == expected.token_ids, (row["method"], row["budget"], row["sample"])


def test_the_order_of_the_questions_and_the_batch_change_no_answer(tiny_llama, tiny_corpus, tmp_path):
    """The questions asked last to first, one answer at a time, give every row the answer it gets asked first
    to last in batches."""
    model, tokenizer = tiny_llama
    task = tiny_task(tiny_corpus)
    forward = Evaluator(model, tokenizer, presses(), BUDGETS, ["agnostic"], tmp_path / "a", progress=False)
    rows = forward.run([task])

    class Reversed(MultiQuestionTask):
        def samples(self, tokenizer):
            return [s for group in contexts_of(super().samples(tokenizer)) for s in reversed(group)]

    backward = Evaluator(
        model, tokenizer, presses(), BUDGETS, ["agnostic"], tmp_path / "b", progress=False, batch_size=1
    )
    again = backward.run(
        [
            Reversed(
                **{k: getattr(task, k) for k in ("lengths", "questions", "num_samples")},
                answer_slack=2,
                essays_dir=task.essays_dir,
                heldout_fraction=TINY_HELDOUT,
            )
        ]
    )
    key = lambda r: (r["sample"], r["method"], r["budget"])  # noqa: E731
    assert {key(r): r["answer_ids"] for r in again} == {key(r): r["answer_ids"] for r in rows}
    asked = [r["sample"][-2:] for r in again if r["method"] == "fullkv"]  # one at a time: in asking order
    assert asked == ["q3", "q2", "q1", "q0"] * task.num_samples


def test_a_context_is_prefilled_once_and_compressed_once_per_method_and_budget(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    model, tokenizer = tiny_llama
    task = tiny_task(tiny_corpus)
    prefills, evictions, streamed = [], [], []
    monkeypatch.setattr(
        lkv.eval.run_multi_question,
        "shared_prefill",
        lambda *a, **k: prefills.append(1) or shared_prefill(*a, **k),
    )
    evict, compress = Compressor.evict, Compressor.compress_context

    def counted_evict(self, scored, budget=None, in_place=False):
        evictions.append((self.press.name, str(budget)))
        return evict(self, scored, budget, in_place)

    def counted_compress(self, context):
        streamed.append((self.press.name, str(self.budget)))
        return compress(self, context)

    monkeypatch.setattr(Compressor, "evict", counted_evict)
    monkeypatch.setattr(Compressor, "compress_context", counted_compress)
    methods = {**presses(), "tova": make_method("tova")}
    Evaluator(model, tokenizer, methods, BUDGETS, ["agnostic"], tmp_path, progress=False, streamed=True).run(
        [task]
    )
    contexts = task.num_samples
    assert len(prefills) == contexts
    counts = {key: evictions.count(key) + streamed.count(key) for key in set(evictions) | set(streamed)}
    names = {methods[m].name for m in methods if m != "fullkv"}
    assert counts == {
        **{(name, str(b)): contexts for name in names for b in BUDGETS},
        ("fullkv", "None"): contexts,  # FullKV's one "eviction", which keeps everything
    }
    # layer-streamed methods compress with a prefill of their own, once per budget too
    assert {name for name, _ in streamed} == {"snapkv", "streamingllm", "tova"}


def test_the_oracle_keeps_the_union_of_the_questions_answer_attention(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    model, tokenizer = tiny_llama
    task = tiny_task(tiny_corpus, num_samples=1)
    seen = {}
    evict = Compressor.evict

    def keep_scores(self, scored, budget=None, in_place=False):
        seen[self.press.name] = scored.scores
        return evict(self, scored, budget, in_place)

    monkeypatch.setattr(Compressor, "evict", keep_scores)
    methods = {"fullkv": FullKVPress(), "oracle": OraclePress()}
    rows = Evaluator(model, tokenizer, methods, [8], ["agnostic"], tmp_path, progress=False).run([task])
    group = task.samples(tokenizer)
    context = encode_sample(group[0], tokenizer)[0]
    shared = shared_prefill(model, torch.tensor([context]), {})
    full = {r["sample"]: r["answer_ids"] for r in rows if r["method"] == "fullkv"}
    per_question = [
        response_importance(
            model,
            shared.cache,
            len(context),
            torch.tensor([encode_sample(s, tokenizer)[1] + full[s.id]]),
            last_queries=len(full[s.id]),
        )
        for s in group
    ]
    torch.testing.assert_close(seen["oracle"], torch.stack(per_question).amax(0)[None])


def test_the_question_aware_setting_is_refused_before_anything_runs(tiny_llama, tiny_corpus, tmp_path):
    model, tokenizer = tiny_llama
    evaluator = Evaluator(model, tokenizer, presses(), [8], ["aware", "agnostic"], tmp_path, progress=False)
    with pytest.raises(
        ValueError, match=r"task multi_question: runs only in the agnostic setting, not aware"
    ):
        evaluator.run([tiny_task(tiny_corpus)])
    assert not evaluator.results.rows


def test_lkv_eval_refuses_the_aware_setting_before_loading_a_model(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError, match=r"multi_question: .*not aware \(give settings: \[agnostic\]\)"):
        lkv.commands.eval.evaluate(
            [tiny_task(tiny_corpus)], methods=("snapkv",), output=str(tmp_path / "out")
        )
    assert not (tmp_path / "out").exists()


def test_a_finished_context_is_not_prefilled_again(tiny_llama, tiny_corpus, tmp_path, monkeypatch):
    model, tokenizer = tiny_llama
    methods = {"snapkv": make_method("snapkv", window=4)}
    first = Evaluator(model, tokenizer, methods, [8], ["agnostic"], tmp_path, progress=False).run(
        [tiny_task(tiny_corpus)]
    )
    assert {r["method"] for r in first} == {"snapkv"}  # FullKV answers (references) but is not listed

    def refuse(*args, **kwargs):
        raise AssertionError("a finished context was prefilled again")

    monkeypatch.setattr(lkv.eval.run_multi_question, "shared_prefill", refuse)
    again = Evaluator(model, tokenizer, methods, [8], ["agnostic"], tmp_path, progress=False)
    assert again.run([tiny_task(tiny_corpus)]) == first


def row(sample: str, method: str, budget: str, score: float, context: str = "c0", k: int = 2) -> dict:
    meta = {"context_id": context, "questions": k, "question_index": int(sample[-1]), "fact_kind": "date"}
    return {
        "task": "multi_question",
        "sample": f"{context}-{sample}",
        "method": method,
        "budget": budget,
        "setting": "agnostic",
        "score": score,
        "metrics": {"string_match": score},
        "meta": meta,
    }


def test_a_context_counts_as_answered_only_when_every_question_is():
    rows = [
        row("q0", "fullkv", "full", 1.0),
        row("q1", "fullkv", "full", 1.0),
        row("q0", "snapkv", "8", 1.0),
        row("q1", "snapkv", "8", 0.5),
        row("q0", "snapkv", "16", 1.0),  # q1 missing: a partial run gives no row
        {**row("q0", "snapkv", "8", 1.0), "meta": {}},  # another task's row
    ]
    derived = {(r["method"], r["budget"]): r for r in all_answered_rows(rows)}
    assert set(derived) == {("fullkv", "full"), ("snapkv", "8")}
    assert derived[("fullkv", "full")]["score"] == 1.0 and derived[("snapkv", "8")]["score"] == 0.0
    assert (
        derived[("snapkv", "8")]["task"] == "multi_question/all"
        and derived[("snapkv", "8")]["sample"] == "c0"
    )


def test_the_report_shows_per_question_and_all_questions_accuracy(tmp_path):
    rows = []
    for c in range(4):
        for q in range(2):
            rows.append(row(f"q{q}", "fullkv", "full", 1.0, f"c{c}"))
            rows.append(row(f"q{q}", "snapkv", "8", float(c < 2 or q == 0), f"c{c}"))
    text = write_report(rows, tmp_path, methods=["fullkv", "snapkv"]).read_text()
    assert (
        "**multi_question**, question-agnostic" in text
        and "**multi_question/all**, question-agnostic" in text
    )
    assert "| snapkv | 75.0 [" in text and "| snapkv | 50.0 [" in text  # 6 of 8 questions, 2 of 4 contexts
    assert "**multi_question** by question index" in text and "**multi_question** by fact kind" not in text
    comparisons = (tmp_path / "comparisons.csv").read_text()
    assert "multi_question/all,agnostic,8,snapkv,fullkv" in comparisons
