"""Batched eval decoding gives batch 1's rows, and settled answers keep their scores.

The exactness tests compare ``lkv eval`` rows decoded in batches with rows decoded one at a time by the
runner *and* with answers from the Compressor's own batch-1 loop (:func:`lkv.core.generation.decode`, an
independent path: a wrong position id would otherwise be shared by both runner settings). The batches mix
prompts of different lengths, compressed caches with prompts shorter than the budget (kept whole, hence
left padding), PyramidKV's ragged caches, and appended questions. Greedy decoding is compared token for
token: a divergence fails naming the row and the step (none was seen on these models).
"""

from __future__ import annotations

import pytest

import lkv.eval.batched_decode
from lkv.core.generation import Sampling
from lkv.eval.runner import Evaluator
from lkv.eval.tasks import NeedleTask, encode_sample
from lkv.eval.tasks.metrics import string_match_all
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress
from lkv.eviction.registry import make_method
from tests.conftest import FAMILIES
from tests.eviction.conftest import build_press

FRACTION = 0.5  # four tiny essays: beta and gamma held out
# Prompts of 206-305 context tokens (+ a ~120-token question): at C = 250 the shorter agnostic contexts are
# kept whole and the others evicted, so a batch of one budget mixes cache lengths (left padding).
BUDGETS = [16, 250]


def needle(corpus, **kwargs) -> NeedleTask:
    settings = {"lengths": (20, 40, 60), "depths": (0.5,), "max_new_tokens": 6, "essays_dir": str(corpus[0])}
    return NeedleTask(heldout_fraction=FRACTION, **{**settings, **kwargs})


def first_difference(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def assert_same_answer(where: str, expected: list[int], got: list[int]) -> None:
    if expected != got:
        step = first_difference(expected, got)
        raise AssertionError(
            f"{where}: batched greedy decoding diverged from batch 1 at answer token {step} (common prefix "
            f"{expected[:step]}; batch 1 then {expected[step:]}, batched {got[step:]})"
        )


def keyed(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["sample"], r["method"], r["budget"], r["setting"]): r for r in rows}


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_eval_rows_are_batch_one_rows(make_tiny_model, tiny_corpus, tmp_path, monkeypatch, family):
    # 5× the default weight scale and an untied head make the greedy choice depend on attention (see
    # tests/labels/test_batched.py): a wrong mask or position of a padded row changes the answers.
    model, tokenizer = make_tiny_model(family, tie_word_embeddings=False, initializer_range=0.1)
    presses = {
        "fullkv": FullKVPress(),
        "snapkv": make_method("snapkv", window=4),
        "pyramidkv": make_method("pyramidkv", window=4),
        "lookaheadkv": build_press("lookaheadkv", model),
    }
    task = needle(tiny_corpus)
    batches = []
    stack = lkv.eval.batched_decode.stack_caches
    monkeypatch.setattr(
        lkv.eval.batched_decode,
        "stack_caches",
        lambda *a: batches.append(stack(*a)) or batches[-1],
    )
    runs = {}
    for size in (1, 4):
        out = tmp_path / f"b{size}"
        runs[size] = keyed(
            Evaluator(model, tokenizer, presses, BUDGETS, output=out, progress=False, batch_size=size).run(
                [task]
            )
        )
    sizes = [len(b.lengths) for b in batches]
    assert max(sizes) == 4 and any(b.padding_fraction > 0 for b in batches), "nothing was batched or padded"
    assert runs[1].keys() == runs[4].keys() and len(runs[1]) == 3 * 2 * (1 + 3 * 2)
    for key, one in runs[1].items():
        many = runs[4][key]
        assert_same_answer(str(key), one["answer_ids"], many["answer_ids"])
        assert (many["score"], many["metrics"], many["prediction"]) == (
            one["score"],
            one["metrics"],
            one["prediction"],
        )
        assert (many["kept_tokens"], many["kv_fraction"]) == (one["kept_tokens"], one["kv_fraction"])

    # Both equal the Compressor's own one-at-a-time answers.
    samples = {s.id: s for s in task.samples(tokenizer)}
    for (sample_id, method, budget, setting), row in runs[4].items():
        context, question = encode_sample(samples[sample_id], tokenizer)
        compressor = Compressor(
            model, tokenizer, presses[method], budget=256 if budget == "full" else int(budget)
        )
        if setting == "aware":
            expected = compressor.decode(compressor.compress(context + question), Sampling(6))
        else:
            expected = compressor.answer(compressor.compress(context), question, Sampling(6))
        assert_same_answer(
            f"{sample_id} {method} C={budget} {setting}", expected.token_ids, row["answer_ids"]
        )


class SettlingNeedle(NeedleTask):
    """A needle task whose answers are strings the tiny model says (its own answers' first characters)."""

    def __init__(self, corpus, answers: dict[str, str]) -> None:
        super().__init__(
            lengths=(20, 40),
            depths=(0.5,),
            max_new_tokens=8,
            essays_dir=str(corpus[0]),
            heldout_fraction=FRACTION,
        )
        self.answers = answers

    def samples(self, tokenizer):
        out = super().samples(tokenizer)
        for sample in out:
            sample.answers = [self.answers[sample.id]]
        return out


def test_answers_stop_once_the_score_is_settled_and_keep_their_scores(tiny_llama, tiny_corpus, tmp_path):
    model, tokenizer = tiny_llama
    presses = {
        "fullkv": FullKVPress(),
        "snapkv": make_method("snapkv", window=4),
        "tova": make_method("tova"),
    }
    probe = Evaluator(
        model, tokenizer, {"fullkv": FullKVPress()}, [16], ["aware"], tmp_path / "probe", progress=False
    )
    full = {
        r["sample"]: r["prediction"]
        for r in probe.run([needle(tiny_corpus, lengths=(20, 40), max_new_tokens=8)])
    }
    answers = {sample: text.strip()[:6] for sample, text in full.items()}  # said within the first few tokens
    assert all(answers.values())
    runs = {}
    for settles in (False, True):
        task = SettlingNeedle(tiny_corpus, answers)
        task.settles_at_full_score = settles
        out = tmp_path / f"settles-{settles}"
        runs[settles] = keyed(
            Evaluator(model, tokenizer, presses, [16, 64], ["aware"], out, progress=False).run([task])
        )
    stopped = 0
    for key, whole in runs[False].items():
        cut = runs[True][key]
        assert cut["score"] == whole["score"], key  # the task's score does not change
        assert whole["answer_ids"][: len(cut["answer_ids"])] == cut["answer_ids"]
        if cut["finish"] == "answered":
            stopped += 1
            assert cut["score"] == 1.0 and len(cut["answer_ids"]) < len(whole["answer_ids"])
            # it stopped at the first token that completed the answer
            shorter = tokenizer.decode(cut["answer_ids"][:-1], skip_special_tokens=True)
            assert string_match_all(shorter, cut["answers"]) < 1.0
        if key[1] == "fullkv":  # the FullKV answer (the Oracle's source, the fidelity reference) is never cut
            assert cut["answer_ids"] == whole["answer_ids"]
    assert stopped > 0, "no answer settled early: the test checks nothing"
