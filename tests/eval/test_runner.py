"""The `lkv eval` runner on a tiny model: outputs, resuming, and equivalence of its shared prefill with
running each method on its own through the Compressor."""

import json
import os
import signal

import pytest
import torch

import lkv.commands.eval
import lkv.commands.eval_run
import lkv.eval.prefill
import lkv.eval.run_end_task
from lkv.core.budget import Budget
from lkv.core.generation import Sampling, eos_ids, prefill
from lkv.core.importance import response_importance
from lkv.core.metrics import kendall_tau_b, topk_recall
from lkv.eval.prefill import shared_prefill, with_protected
from lkv.eval.results import (
    FULL,
    NO_BUDGET,
    ResultsFile,
    budget_key,
    budget_order,
    check_run,
    copy_adapter_free,
    fingerprint,
    parse_budget_key,
)
from lkv.eval.run_end_task import EndTaskRun
from lkv.eval.runner import Evaluator
from lkv.eval.tasks import ImportanceTask, NeedleTask, encode_sample
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress, OraclePress, PressContext, ProbePress
from lkv.eviction.presses.lookaheadkv import DEFAULT_KERNEL
from lkv.eviction.registry import make_method
from lkv.eviction.selector import Selection
from lkv.labels.labeller import label_prompt, make_meta
from lkv.labels.shards import ShardWriter
from lkv.model.backbone import model_signature
from lkv.model.probe import ImportanceProbe
from tests.conftest import make_label_folder, tiny_needle_task


def read_rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def test_runner_writes_reports_and_resumes_without_redoing_rows(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    model, tokenizer = tiny_llama
    presses = {"snapkv": make_method("snapkv", window=4), "tova": make_method("tova")}
    out = tmp_path / "eval"
    rows = Evaluator(model, tokenizer, presses, [8, 16], ["aware", "agnostic"], out, progress=False).run(
        [tiny_needle_task(tiny_corpus)]
    )
    assert len(rows) == 2 * 2 * 2  # methods × budgets × settings, one sample (FullKV runs but is not listed)
    keys = {(r["method"], r["budget"], r["setting"]) for r in read_rows(out)}
    assert keys == {(m, b, s) for m in presses for b in ("8", "16") for s in ("aware", "agnostic")}
    for row in rows:
        assert row["kept_tokens"] == int(row["budget"]) and 0 < row["kv_fraction"] < 1
        assert set(row["metrics"]) == {"string_match", "fullkv_f1"} and row["meta"]["depth"] == 0.5

    from lkv.eval.report import write_report

    report = write_report(rows, out, title="tiny", methods=list(presses))
    text = report.read_text()
    assert "**niah**, question-aware" in text and "**niah**, question-agnostic" in text
    assert "| snapkv |" in text and "| C=8 | C=16 |" in text
    summary = (out / "summary.csv").read_text().splitlines()
    assert (
        summary[0].startswith("task,setting,method,budget,n,score,ci_low,ci_high") and len(summary) == 1 + 8
    )
    assert {p.name for p in (out / "plots").iterdir()} == {
        "niah_aware.png",
        "niah_agnostic.png",
        "niah_heatmap_aware.png",
        "niah_heatmap_agnostic.png",
    }
    assert {p.parent.name for p in (out / "tensorboard" / "eval").glob("*/events.out.tfevents.*")} == set(
        presses
    )

    # Rerun: every row is done, so nothing is even prefilled.
    def refuse(*args, **kwargs):
        raise AssertionError("a finished sample was prefilled again")

    monkeypatch.setattr(lkv.eval.run_end_task, "shared_prefill", refuse)
    again = Evaluator(model, tokenizer, presses, [8, 16], ["aware", "agnostic"], out, progress=False)
    assert len(again.run([tiny_needle_task(tiny_corpus)])) == 8
    monkeypatch.undo()

    # Lose the last two rows and a half-written line (a killed run): exactly those rows are redone.
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:20])
    calls = []
    monkeypatch.setattr(
        lkv.eval.run_end_task, "shared_prefill", lambda *a, **k: calls.append(1) or shared_prefill(*a, **k)
    )
    redone = Evaluator(model, tokenizer, presses, [8, 16], ["aware", "agnostic"], out, progress=False).run(
        [tiny_needle_task(tiny_corpus)]
    )
    assert len(calls) == 1  # one (sample, setting) had missing rows
    assert [r["prediction"] for r in redone[-2:]] == [json.loads(line)["prediction"] for line in lines[-2:]]
    assert len({(r["method"], r["budget"], r["setting"]) for r in redone}) == 8

    # A row scored on another prompt under the same id (its haystack's files changed): resuming is refused.
    lines = (out / "results.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["meta"]["depth"] = 0.25
    (out / "results.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"now build other prompts .* \(meta differs in: depth\)"):
        Evaluator(model, tokenizer, presses, [8, 16], ["aware", "agnostic"], out, progress=False).run(
            [tiny_needle_task(tiny_corpus)]
        )


def test_a_method_added_to_a_finished_folder_reuses_the_fullkv_answers(tiny_llama, tiny_corpus, tmp_path):
    """A chunk whose every FullKV answer is already in the folder decodes none again (and has none to stack)."""
    model, tokenizer = tiny_llama
    out, task = tmp_path / "eval", tiny_needle_task(tiny_corpus)
    first = {"fullkv": FullKVPress(), "snapkv": make_method("snapkv", window=4)}
    Evaluator(model, tokenizer, first, [8], ["aware", "agnostic"], out, progress=False).run([task])
    before = read_rows(out)
    more = {**first, "tova": make_method("tova")}
    rows = Evaluator(model, tokenizer, more, [8], ["aware", "agnostic"], out, progress=False).run([task])
    assert {(r["method"], r["setting"]) for r in rows} == {
        (m, s) for m in more for s in ("aware", "agnostic")
    }
    assert [r for r in read_rows(out) if r["method"] != "tova"] == before


WINDOWED = ("snapkv", "pyramidkv", "laq", "speckv")
SCORED = ("snapkv", "pyramidkv", "h2o", "tova", "streamingllm", "laq", "speckv")


def test_shared_prefill_scores_like_each_method_alone(tiny_llama):
    model, tokenizer = tiny_llama
    presses = {m: make_method(m, **({"window": 4} if m in WINDOWED else {})) for m in SCORED}
    presses["scissorhands"] = make_method("scissorhands", history=4)
    for seed in (0, 1):  # two probes: each keeps its own scores of the attention inputs
        presses[f"probe{seed}"] = ProbePress(ImportanceProbe.create(model, hidden_dim=8, seed=seed))
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    shared = shared_prefill(model, ids, presses)
    # one window capture serves the four windowed methods (they only read it), plus H2O's and TOVA's, plus
    # Scissorhands' per-query rows over the same 4-query window (another kind of capture, never merged),
    # plus each probe's own
    assert len({id(c) for c in shared.captures.values() if c is not None}) == 6
    for name in presses:  # in turn on the same cache: LAQ/SpecKV append tokens and must crop them again
        ctx = PressContext(
            model, ids, shared.cache, shared.next_logits, shared.captures[name], eos_ids(model, tokenizer)
        )
        alone = Compressor(model, tokenizer, presses[name]).score(ids).scores
        torch.testing.assert_close(presses[name].score(ctx), alone, msg=name)


@pytest.mark.parametrize("setting", ["aware", "agnostic"])
def test_rows_match_running_each_method_through_the_compressor(tiny_llama, tiny_corpus, tmp_path, setting):
    model, tokenizer = tiny_llama
    presses = {
        "h2o": make_method("h2o", recent=2),
        "snapkv": make_method("snapkv", window=4),
        "h2o-decode": make_method("h2o-decode", every=1),
        "scissorhands": make_method("scissorhands", history=4, every=2),
        "quest": make_method("quest", page_size=4),
        "probe": ProbePress(ImportanceProbe.create(model, hidden_dim=8)),
    }
    task = tiny_needle_task(tiny_corpus, max_new_tokens=4)
    rows = Evaluator(model, tokenizer, presses, [12], [setting], tmp_path, progress=False).run([task])
    (sample,) = task.samples(tokenizer)
    context, question = encode_sample(sample, tokenizer)
    for row in rows:
        compressor = Compressor(model, tokenizer, presses[row["method"]], budget=12)
        if setting == "aware":
            expected = compressor.decode(compressor.compress(context + question), Sampling(4))
        else:
            expected = compressor.answer(compressor.compress(context), question, Sampling(4))
        assert row["prediction"] == expected.text and row["answer_ids"] == expected.token_ids


def test_oracle_is_the_registry_oracle_in_the_aware_setting(tiny_llama):
    model, tokenizer = tiny_llama
    ids = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(2))
    full = Compressor(model, tokenizer, FullKVPress())
    answer = full.decode(full.compress(ids), Sampling(5)).token_ids
    shared = shared_prefill(model, ids, {})
    # the runner's Oracle scores: the answer's queries only (here every query: nothing is appended)
    ours = response_importance(model, shared.cache, 30, torch.tensor([answer]), last_queries=len(answer))[
        None
    ]
    registry = Compressor(model, tokenizer, OraclePress(response_tokens=5)).score(ids).scores
    torch.testing.assert_close(ours, registry)
    assert shared.cache.get_seq_length() == 30  # cropped back


def test_fullkv_and_oracle_rows_and_agreement(tiny_llama, tiny_corpus, tmp_path):
    model, tokenizer = tiny_llama
    presses = {"fullkv": FullKVPress(), "oracle": OraclePress(), "random": make_method("random")}
    rows = Evaluator(model, tokenizer, presses, [8], ["agnostic"], tmp_path, progress=False).run(
        [tiny_needle_task(tiny_corpus)]
    )
    by_method = {r["method"]: r for r in rows}
    assert by_method["fullkv"]["budget"] == "full" and by_method["fullkv"]["kv_fraction"] == 1.0
    assert "fullkv_f1" not in by_method["fullkv"]["metrics"]
    for method in ("oracle", "random"):
        row = by_method[method]
        same = row["prediction"] == by_method["fullkv"]["prediction"]
        assert (row["metrics"]["fullkv_f1"] == 1.0) or not same


def test_importance_rows_rank_each_method_against_the_labels(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    folder = tmp_path / "labels"
    meta = make_meta(
        model_signature(model, tokenizer, "tiny").to_dict(), 6, 64, "middle", "float32", True, "test"
    )
    writer = ShardWriter(folder, meta, shard_size=8)
    for i in range(2):
        prompt = torch.randint(3, 300, (24,), generator=torch.Generator().manual_seed(i)).tolist()
        label = label_prompt(model, prompt, 6, eos_ids(model, tokenizer))
        writer.add(id=f"p{i}", prompt_ids=prompt, response_ids=label.response_ids, scores=label.scores)
    writer.flush()
    presses = {
        "fullkv": FullKVPress(),
        "snapkv": make_method("snapkv", window=4),
        "random": make_method("random"),
    }
    task = ImportanceTask(str(folder), budgets=(4, 8))
    rows = Evaluator(model, tokenizer, presses, [8], ["aware"], tmp_path / "out", progress=False).run([task])
    assert {(r["sample"], r["method"]) for r in rows} == {
        (p, m) for p in ("p0", "p1") for m in ("snapkv", "random")
    }
    sample = next(task.samples())
    compressor = Compressor(model, tokenizer, presses["snapkv"])
    scores = with_protected(compressor.score(torch.tensor([sample.prompt_ids])).scores[0], presses["snapkv"])
    row = next(r for r in rows if (r["sample"], r["method"]) == (sample.id, "snapkv"))
    assert row["metrics"]["recall@4"] == pytest.approx(topk_recall(scores, sample.target, 4).mean().item())
    assert row["metrics"]["kendall_tau"] == pytest.approx(kendall_tau_b(scores, sample.target).mean().item())
    assert row["score"] == row["metrics"]["recall@4"]


def test_importance_of_a_responses_only_folder_computes_the_ground_truth_online(tiny_llama, tmp_path):
    # `lkv label --store_scores false` (the paper configs' held-out folders): same rows as with scores
    model, tokenizer = tiny_llama
    presses = {"snapkv": make_method("snapkv", window=4), "tova": make_method("tova")}
    metrics = {}
    for store in (True, False):
        folder = make_label_folder(model, tokenizer, tmp_path / f"labels-{store}", num=2, store_scores=store)
        task = ImportanceTask(str(folder), budgets=(4, 8))
        out = tmp_path / f"out-{store}"
        rows = Evaluator(model, tokenizer, presses, [8], ["aware"], out, progress=False).run([task])
        metrics[store] = {(r["sample"], r["method"]): r["metrics"] for r in rows}
    assert len(metrics[False]) == 4 and metrics[False].keys() == metrics[True].keys()
    for key, stored in metrics[True].items():
        assert metrics[False][key] == pytest.approx(stored, abs=1e-6), key


@pytest.mark.parametrize("store", [True, False])
def test_importance_metrics_are_computed_where_the_scores_are(tiny_llama, tmp_path, monkeypatch, store):
    """No host transfer of scores or ground truth: the Recall and τ metrics (validation's torchmetrics code)
    run on the model's device. There is no GPU here, so any ``.cpu()`` of a ``(layers, kv_heads, S)`` tensor
    fails the test, and the tensors the metrics see are checked."""
    import lkv.core.metrics

    model, tokenizer = tiny_llama
    folder = make_label_folder(model, tokenizer, tmp_path / "labels", num=2, store_scores=store)
    cpu = torch.Tensor.cpu

    def no_host_copy(tensor, *args, **kwargs):
        if tensor.ndim == 3:
            raise AssertionError(f"a {tuple(tensor.shape)} tensor was moved to the host for the metrics")
        return cpu(tensor, *args, **kwargs)

    seen = []
    update = lkv.core.metrics._RowMean.update

    def spy(metric, pred, target):
        seen.append((type(metric).__name__, pred.device, target.device, pred.dtype))
        update(metric, pred, target)

    monkeypatch.setattr(torch.Tensor, "cpu", no_host_copy)
    monkeypatch.setattr(lkv.core.metrics._RowMean, "update", spy)
    presses = {"snapkv": make_method("snapkv", window=4)}
    task = ImportanceTask(str(folder), budgets=(4, 8))
    rows = Evaluator(model, tokenizer, presses, [8], ["aware"], tmp_path / "out", progress=False).run([task])
    device = next(model.parameters()).device
    assert len(rows) == 2 and {name for name, *_ in seen} == {"RecallAtC", "KendallTau"}
    assert {tuple(s[1:]) for s in seen} == {(device, device, torch.float32)}
    monkeypatch.undo()
    # the values are Recall@C and τ-b of the scores, as before
    sample = next(task.samples())
    target = sample.target if store else rows_target(model, sample)
    scores = with_protected(
        Compressor(model, tokenizer, presses["snapkv"]).score(torch.tensor([sample.prompt_ids])).scores[0],
        presses["snapkv"],
    )
    row = next(r for r in rows if r["sample"] == sample.id)
    assert row["metrics"]["recall@8"] == pytest.approx(topk_recall(scores, target, 8).mean().item())
    assert row["metrics"]["kendall_tau"] == pytest.approx(kendall_tau_b(scores, target).mean().item())


def rows_target(model, sample) -> torch.Tensor:
    """The ground truth of a responses-only label: its response teacher-forced on the prompt's prefill."""
    from lkv.labels.batched import label_response

    return label_response(model, sample.prompt_ids, sample.response_ids)


def test_with_protected_marks_kept_positions():
    scores = torch.arange(6.0).view(1, 6)
    assert with_protected(scores, make_method("streamingllm", sink=2)).tolist() == [
        [float("inf")] * 2 + [2, 3, 4, 5]
    ]
    assert with_protected(scores, make_method("h2o", recent=1)).tolist() == [[0, 1, 2, 3, 4, float("inf")]]


def test_a_folder_of_another_run_is_refused(tmp_path):
    check_run(tmp_path, {"model": "m", "adapter": "aaa"})
    check_run(tmp_path, {"model": "m", "adapter": "aaa"})  # same run: resumes
    with pytest.raises(ValueError, match=r"another run \(differs in: adapter"):
        check_run(tmp_path, {"model": "m", "adapter": "bbb"})
    with pytest.raises(ValueError, match=r"another run \(differs in: model"):
        check_run(tmp_path, {"model": "n", "adapter": None})


def test_head_budget_is_part_of_the_run(tmp_path):
    check_run(tmp_path, {"model": "m", "adapter": None})  # a folder from before the setting existed
    check_run(tmp_path, {"model": "m", "adapter": None, "head_budget": "equal"})  # resumes: it was equal
    with pytest.raises(ValueError, match=r"differs in: head_budget"):
        check_run(tmp_path, {"model": "m", "adapter": None, "head_budget": "adaptive"})


def test_adaptive_head_budget_rows_match_the_compressor(tiny_llama, tiny_corpus, tmp_path):
    model, tokenizer = tiny_llama
    presses = {"snapkv": make_method("snapkv", window=4), "keydiff": make_method("keydiff")}
    task = tiny_needle_task(tiny_corpus, max_new_tokens=4)
    for streamed in (False, True):
        out = tmp_path / f"streamed-{streamed}"
        rows = Evaluator(
            model,
            tokenizer,
            presses,
            [12],
            ["aware", "agnostic"],
            out,
            False,
            streamed,
            selection=Selection(head_budget="adaptive"),
        ).run([task])
        (sample,) = task.samples(tokenizer)
        context, question = encode_sample(sample, tokenizer)
        for row in rows:
            compressor = Compressor(
                model,
                tokenizer,
                presses[row["method"]],
                budget=12,
                selection=Selection(head_budget="adaptive"),
            )
            if row["setting"] == "aware":
                expected = compressor.decode(compressor.compress(context + question), Sampling(4))
            else:
                expected = compressor.answer(compressor.compress(context), question, Sampling(4))
            assert row["answer_ids"] == expected.token_ids and row["kept_tokens"] == 12
            assert row["kv_fraction"] == expected.kv_bytes_kept / expected.kv_bytes_full


def test_threshold_rows_sit_at_the_budget_on_average(tiny_llama, tiny_corpus, tmp_path):
    """One threshold per (task, method, budget), calibrated on the task's prompts: the rows' mean kept entries
    per (layer, KV head) is the budget within 1 %, each row recording its threshold and spread; a row is the
    Compressor's answer with that threshold (streamed and two-phase alike)."""
    model, tokenizer = tiny_llama
    presses = {"snapkv": make_method("snapkv", window=4), "keydiff": make_method("keydiff")}
    task = tiny_needle_task(tiny_corpus, lengths=(40, 60, 80), depths=(0.3, 0.7), max_new_tokens=3)
    selection = Selection(head_budget="threshold")
    for streamed in (False, True):
        out = tmp_path / f"streamed-{streamed}"
        rows = Evaluator(
            model, tokenizer, presses, [12], ["aware", "agnostic"], out, False, streamed, selection=selection
        ).run([task])
        assert len(rows) == 2 * 6 * 2
        for method in presses:
            mine = [row for row in rows if row["method"] == method]
            mean = sum(row["kept_tokens"] for row in mine) / len(mine)
            assert mean == pytest.approx(12, rel=0.01)
            assert len({row["threshold"] for row in mine}) == 1 and all(row["kept_std"] > 0 for row in mine)
            assert len({row["kept_tokens"] for row in mine}) > 1  # budgets vary per prompt
        row = next(r for r in rows if r["setting"] == "agnostic" and r["method"] == "keydiff")
        sample = next(s for s in task.samples(tokenizer) if s.id == row["sample"])
        context, question = encode_sample(sample, tokenizer)
        chosen = Selection(head_budget="threshold", threshold=row["threshold"])
        compressor = Compressor(model, tokenizer, presses["keydiff"], 12, chosen)
        expected = compressor.answer(compressor.compress(context), question, Sampling(3))
        assert row["answer_ids"] == expected.token_ids


def test_baselines_first_then_the_adapter_rows_in_one_folder(tmp_path):
    # a run without lookaheadkv (adapter None) and a later one with it share the folder; the adapter is kept
    check_run(tmp_path, {"model": "m", "adapter": None})
    check_run(tmp_path, {"model": "m", "adapter": "aaa"})
    assert json.loads((tmp_path / "run.json").read_text()) == {"model": "m", "adapter": "aaa"}
    check_run(tmp_path, {"model": "m", "adapter": None})  # more baselines: the adapter's rows stay valid
    assert json.loads((tmp_path / "run.json").read_text())["adapter"] == "aaa"
    with pytest.raises(ValueError, match=r"another run \(differs in: adapter"):
        check_run(tmp_path, {"model": "m", "adapter": "bbb"})


def test_a_lookahead_modules_settings_count_only_where_its_rows_are(tmp_path):
    kernel = {"lookaheadkv": {"kernel": 7}}
    # a folder from before the kernel was recorded, with lookaheadkv rows: they were scored with kernel 1
    old = {"model": "m", "adapter": "aaa", "press_args": {"snapkv": {"window": 4}}}
    check_run(tmp_path / "old", old)
    with pytest.raises(ValueError, match="differs in: press_args"):
        check_run(tmp_path / "old", {**old, "press_args": {"snapkv": {"window": 4}, **kernel}})
    check_run(
        tmp_path / "old", {**old, "press_args": {"snapkv": {"window": 4}, "lookaheadkv": {"kernel": 1}}}
    )
    # baselines only (no adapter): a module added later brings its own settings; a baseline's must match
    base = {"model": "m", "adapter": None, "press_args": {"snapkv": {"window": 4}}}
    check_run(tmp_path / "base", base)
    check_run(
        tmp_path / "base", {**base, "adapter": "aaa", "press_args": {"snapkv": {"window": 4}, **kernel}}
    )
    assert json.loads((tmp_path / "base" / "run.json").read_text())["press_args"]["lookaheadkv"] == {
        "kernel": 7
    }
    # a baseline's settings count where its rows are: none yet, then one
    check_run(tmp_path / "base", {**base, "press_args": {"snapkv": {"window": 4}, "probe": {"folder": "p"}}})
    row = {"task": "t", "sample": "s", "method": "snapkv", "budget": "16", "setting": "aware"}
    (tmp_path / "base" / "results.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="differs in: press_args"):
        check_run(tmp_path / "base", {**base, "press_args": {"snapkv": {"window": 8}}})
    # a copy keeps the baselines' settings, not the module's
    (tmp_path / "base" / "results.jsonl").write_text("")
    copy_adapter_free(tmp_path / "base", tmp_path / "copy")
    copied = json.loads((tmp_path / "copy" / "run.json").read_text())
    assert copied["adapter"] is None and copied["press_args"] == {
        "snapkv": {"window": 4},
        "probe": {"folder": "p"},
    }


def test_a_method_without_rows_brings_its_own_settings(tmp_path):
    """A FullKV-only stage, then every method with its settings into the same folder; a method whose rows
    are there keeps its settings."""
    check_run(tmp_path, {"model": "m", "adapter": None, "press_args": {}})
    fullkv = {"task": "t", "sample": "s", "method": "fullkv", "budget": "full", "setting": "agnostic"}
    (tmp_path / "results.jsonl").write_text(json.dumps(fullkv) + "\n")
    added = {"probe": {"folder": "p0"}, "restorekv": {"folder": "r0"}}
    check_run(tmp_path, {"model": "m", "adapter": None, "press_args": added})
    assert json.loads((tmp_path / "run.json").read_text())["press_args"] == added
    with open(tmp_path / "results.jsonl", "a") as rows:
        rows.write(json.dumps({**fullkv, "method": "probe", "budget": "0.5"}) + "\n")
    with pytest.raises(ValueError, match="differs in: press_args"):
        check_run(
            tmp_path, {"model": "m", "adapter": None, "press_args": {**added, "probe": {"folder": "p1"}}}
        )
    check_run(
        tmp_path, {"model": "m", "adapter": None, "press_args": {**added, "restorekv": {"folder": "r1"}}}
    )


def test_evaluate_checks_its_arguments_before_loading(tmp_path, monkeypatch):
    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", lambda *a, **k: pytest.fail("loaded a model"))
    monkeypatch.setattr(lkv.commands.eval_run, "load_module", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError, match=r"decode-time methods \['quest'\] keep equal budgets"):
        lkv.commands.eval.evaluate(
            [], methods=("snapkv", "quest"), head_budget="adaptive", output=str(tmp_path)
        )
    with pytest.raises(ValueError, match="--adapter is required by the lookaheadkv"):
        lkv.commands.eval.evaluate([], methods=("lookaheadkv",), output=str(tmp_path))
    with pytest.raises(ValueError, match="--probe is required by the probe method"):
        lkv.commands.eval.evaluate([], methods=("snapkv",), probe=str(tmp_path), output=str(tmp_path))
    with pytest.raises(ValueError, match="press_args given for"):
        lkv.commands.eval.evaluate([], methods=("snapkv",), press_args={"tova": {}}, output=str(tmp_path))
    with pytest.raises(ValueError, match="--max_batch_tokens: expected a positive number, found 0"):
        lkv.commands.eval.evaluate([], max_batch_tokens=0, output=str(tmp_path))
    for bad, said in [
        ((0,), "≥ 1 token per head, got 0"),
        ((-3,), "got -3"),
        ((1.5,), "budget 1.5 is neither"),
    ]:
        with pytest.raises(ValueError, match=f"--budgets: .*{said}"):
            lkv.commands.eval.evaluate([], budgets=bad, output=str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="--budgets: give at least one budget"):
        lkv.commands.eval.evaluate([], budgets=(), output=str(tmp_path / "bad"))
    for bad, said in [({"window": -1}, "window must be positive, got -1"), ({"windw": 4}, "windw")]:
        with pytest.raises(ValueError, match=f"press_args for snapkv: .*{said}"):
            lkv.commands.eval.evaluate(
                [], methods=("snapkv",), press_args={"snapkv": bad}, output=str(tmp_path / "bad")
            )
    assert not (tmp_path / "bad").exists()  # refused before run.json is written


def snapkv_run(corpus, out, **extra) -> dict:
    """Arguments of an ``lkv eval`` run of FullKV and SnapKV (C = 8) on one tiny needle into ``out``."""
    return dict(
        tasks=[tiny_needle_task(corpus)],
        methods=("fullkv", "snapkv"),
        budgets=(8,),
        press_args={"snapkv": {"window": 4}},
        output=str(out),
        progress=False,
        **extra,
    )


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_an_interrupted_eval_reports_its_rows_so_far_and_resumes(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch, stop
):
    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", lambda *a, **k: tiny_llama)
    run_chunk = EndTaskRun._run_chunk

    def stop_after_first_chunk(self, task, units):
        run_chunk(self, task, units)
        if stop == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # the handler turns it into SystemExit(143)

    monkeypatch.setattr(EndTaskRun, "_run_chunk", stop_after_first_chunk)
    out = tmp_path / "eval"
    args = snapkv_run(tiny_corpus, out, batch_size=1)  # one (sample, setting) per chunk: two chunks
    with pytest.raises(KeyboardInterrupt if stop == "ctrl-c" else SystemExit) as stopped:
        lkv.commands.eval.evaluate(**args)
    if stop == "sigterm":
        assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    assert len(read_rows(out)) == 2  # one setting: FullKV and SnapKV
    report = (out / "report.md").read_text()
    assert "**Partial report**: the run was interrupted with 2 rows" in report and "| snapkv |" in report

    # A row that another process (the other setting's) appended meanwhile is in the final report.
    other = {**read_rows(out)[1], "method": "tova"}
    ResultsFile(out / "results.jsonl").add(other)
    monkeypatch.setattr(EndTaskRun, "_run_chunk", run_chunk)
    assert lkv.commands.eval.evaluate(**args).startswith("lkv eval: 5 result rows")
    report = (out / "report.md").read_text()
    assert "Partial report" not in report and "| tova |" in report


def test_a_resumed_eval_that_adds_no_row_leaves_the_report_alone(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    """Rerunning a finished command rewrites neither report.md nor the TensorBoard event files (whose names and
    wall times would change: churn in a committed folder); a missing report is written again."""
    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", lambda *a, **k: tiny_llama)
    out = tmp_path / "eval"
    args = snapkv_run(tiny_corpus, out)
    assert "report:" in lkv.commands.eval.evaluate(**args)

    def written() -> dict[str, int]:
        files = [
            out / "report.md",
            out / "summary.csv",
            *(out / "tensorboard").rglob("events.out.tfevents.*"),
        ]
        return {str(f.relative_to(out)): f.stat().st_mtime_ns for f in files}

    before = written()
    assert "none new; report left as it was" in lkv.commands.eval.evaluate(**args)
    assert written() == before
    (out / "report.md").unlink()
    assert "none new" not in lkv.commands.eval.evaluate(**args)
    assert "| snapkv |" in (out / "report.md").read_text()


@pytest.mark.slow
def test_fullkv_finds_a_heldout_needle_on_smollm2(tmp_path):
    from lkv.model.backbone import load_backbone

    model, tokenizer = load_backbone("smollm2-135m")
    presses = {"fullkv": FullKVPress(), "streamingllm": make_method("streamingllm")}
    task = NeedleTask(lengths=(1024,), depths=(0.5,), max_new_tokens=12)
    rows = Evaluator(model, tokenizer, presses, [64], ["aware"], tmp_path, progress=False).run([task])
    by_method = {r["method"]: r for r in rows}
    assert by_method["fullkv"]["score"] == 1.0, by_method["fullkv"]["prediction"]
    # 64 recent tokens hold only the question, not the needle in the middle of the haystack
    assert by_method["streamingllm"]["score"] == 0.0


def test_eval_timings_read_the_synchronised_clock(tiny_llama, monkeypatch):
    """Prefill and scoring seconds come from lkv.core.clock (which waits for CUDA), as the Compressor's do."""
    model, _ = tiny_llama
    seen = []
    ticks = iter(range(100))

    def spy(device):
        seen.append(device)
        return float(next(ticks))

    monkeypatch.setattr(lkv.eval.prefill, "clock", spy)
    ids = torch.arange(1, 20)[None]
    shared = shared_prefill(model, ids, {"snapkv": make_method("snapkv", window=4)})
    assert shared.seconds == 1.0 and seen == [ids.device] * 2


def test_clock_waits_for_cuda(monkeypatch):
    import lkv.core.clock

    synced = []
    monkeypatch.setattr(lkv.core.clock.torch.cuda, "synchronize", synced.append)
    lkv.core.clock.clock(torch.device("cpu"))
    lkv.core.clock.clock(torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)]


def test_adapter_free_rows_start_a_folder_for_another_adapter(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    check_run(source, {"model": "m", "adapter": "aaa", "probe": "ppp"})
    rows = [
        {"task": "t", "sample": "s", "method": m, "budget": "8", "setting": "aware"}
        for m in ("fullkv", "lookaheadkv", "probe")
    ]
    (source / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert copy_adapter_free(source, target) == 2
    assert [r["method"] for r in ResultsFile(target / "results.jsonl").rows] == ["fullkv", "probe"]
    check_run(target, {"model": "m", "adapter": "bbb", "probe": "ppp"})  # another adapter resumes it
    with pytest.raises(ValueError, match="differs in: probe"):  # the probe's rows are another probe's
        check_run(target, {"model": "m", "adapter": "bbb", "probe": "qqq"})
    with pytest.raises(FileExistsError):
        copy_adapter_free(source, target)
    # without the probe's rows and record, a run with another probe resumes the copy
    other = tmp_path / "c"
    assert copy_adapter_free(source, other, keep_probe=False) == 1
    assert [r["method"] for r in ResultsFile(other / "results.jsonl").rows] == ["fullkv"]
    check_run(other, {"model": "m", "adapter": "bbb", "probe": "qqq"})


def test_named_modules_may_join_a_folder_but_keep_their_module(tmp_path):
    check_run(tmp_path, {"model": "m", "adapter": "aaa", "adapters": {"s1": "111"}})
    check_run(tmp_path, {"model": "m", "adapter": "aaa", "adapters": {"s2": "222"}})  # a later module joins
    assert json.loads((tmp_path / "run.json").read_text())["adapters"] == {"s1": "111", "s2": "222"}
    check_run(tmp_path, {"model": "m", "adapter": "aaa"})  # a run without them leaves them be
    with pytest.raises(ValueError, match=r"other lookahead modules under the names \['s1'\]"):
        check_run(tmp_path, {"model": "m", "adapter": "aaa", "adapters": {"s1": "999"}})


def test_several_adapters_score_one_prefill_as_each_alone(tiny_llama, tiny_corpus, tmp_path, monkeypatch):
    """`--adapters`: every module's rows equal an eval of that module alone, from one prefill per sample."""
    import lkv.eviction.presses.lookaheadkv
    from lkv.model.lookahead import LookaheadAdapter
    from tests.conftest import build_tiny_model
    from tests.model.test_lookahead import perturb_lora

    folders = {}
    for seed in (1, 2):
        model, _ = build_tiny_model("llama")
        adapter = LookaheadAdapter.create(model, num_tokens=3, seed=seed)
        perturb_lora(adapter, seed=seed)
        adapter.save(tmp_path / f"adapter{seed}")
        folders[seed] = str(tmp_path / f"adapter{seed}")
    monkeypatch.setattr(
        lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model("llama")
    )
    prefills = []
    monkeypatch.setattr(lkv.eval.prefill, "prefill", lambda *a, **k: prefills.append(1) or prefill(*a, **k))
    args = dict(tasks=[tiny_needle_task(tiny_corpus)], budgets=(8,), settings=("aware",), progress=False)
    lkv.commands.eval.evaluate(
        methods=("lookaheadkv",),
        adapter=folders[1],
        adapters={"two": folders[2]},
        output=str(tmp_path / "both"),
        **args,
    )
    assert len(prefills) == 1  # one sample, one setting: one prefill for both modules
    both = {r["method"]: r for r in read_rows(tmp_path / "both")}
    assert set(both) == {"lookaheadkv", "lookaheadkv:two"}
    for seed, method in ((1, "lookaheadkv"), (2, "lookaheadkv:two")):
        lkv.commands.eval.evaluate(
            methods=("lookaheadkv",), adapter=folders[seed], output=str(tmp_path / f"alone{seed}"), **args
        )
        (alone,) = read_rows(tmp_path / f"alone{seed}")
        assert both[method]["answer_ids"] == alone["answer_ids"]
    # on one model the two modules score as each alone, and differently from each other
    from lkv.eviction.presses import LookaheadKVPress

    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(0))
    first = LookaheadKVPress.from_folder(folders[1], build_tiny_model("llama")[0])
    second = LookaheadKVPress.from_folder(folders[2], first.adapter.model, adapter_name="two")
    scores = {}
    for name, press in (("first", first), ("second", second)):
        cache, _ = prefill(press.base_model, ids)
        with torch.no_grad():
            scores[name] = press.adapter.predict(cache, 40)
    for seed, name in ((1, "first"), (2, "second")):
        alone = LookaheadKVPress.from_folder(folders[seed], build_tiny_model("llama")[0])
        with torch.no_grad():
            want = alone.adapter.predict(prefill(alone.base_model, ids)[0], 40)
        torch.testing.assert_close(scores[name], want)
    assert (scores["first"] - scores["second"]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="give --adapter too"):
        lkv.commands.eval.evaluate(
            methods=("snapkv",), adapters={"two": folders[2]}, output=str(tmp_path / "x"), **args
        )


def test_press_args_pool_a_lookahead_module_and_keep_the_run_settings(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    """`press_args` reach `lookaheadkv` and named modules (their settings only); the run's settings stay its own."""
    import lkv.eviction.presses.lookaheadkv
    from lkv.model.lookahead import LookaheadAdapter
    from tests.conftest import build_tiny_model
    from tests.model.test_lookahead import perturb_lora

    model, _ = build_tiny_model("llama")
    adapter = LookaheadAdapter.create(model, num_tokens=3)
    perturb_lora(adapter)
    adapter.save(tmp_path / "adapter")
    monkeypatch.setattr(
        lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model("llama")
    )
    args = dict(tasks=[tiny_needle_task(tiny_corpus)], budgets=(8,), settings=("aware",), progress=False)
    folder = str(tmp_path / "adapter")
    lkv.commands.eval.evaluate(
        methods=("lookaheadkv",),
        adapter=folder,
        adapters={"pooled": folder},
        press_args={"lookaheadkv:pooled": {"kernel": 5}},
        output=str(tmp_path / "out"),
        **args,
    )
    rows = read_rows(tmp_path / "out")
    assert {(r["method"], r["setting"]) for r in rows} == {
        ("lookaheadkv", "aware"),
        ("lookaheadkv:pooled", "aware"),
    }
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["press_args"]
    assert recorded == {"lookaheadkv": {"kernel": DEFAULT_KERNEL}, "lookaheadkv:pooled": {"kernel": 5}}
    # rows scored without pooling (the default before) are not resumed under the pooled default
    unpooled = str(tmp_path / "unpooled")
    one = dict(methods=("lookaheadkv",), adapter=folder, output=unpooled, **args)
    lkv.commands.eval.evaluate(press_args={"lookaheadkv": {"kernel": 1}}, **one)
    with pytest.raises(ValueError, match="differs in: press_args"):
        lkv.commands.eval.evaluate(**one)
    for own, said in [
        ({"window": 4}, "press_args for lookaheadkv: unknown key window; lookaheadkv takes preset, kernel"),
        ({"sentences": 1.5}, "lookaheadkv: sentences must be a share of the budget in \\(0, 1\\]"),
        ({"sentences_beyond": 512}, "lookaheadkv: sentences_beyond given without sentences > 0"),
        (
            {"sentences": 0.5, "sentences_scaled": True},
            "lookaheadkv: sentences_scaled scales the share .*give sentences_beyond > 0",
        ),
        ({"probe_weight": 0.5}, "fuse the module with a probe .*there is none: give --probe"),
        ({"preset": "long"}, "fuse the module with a probe .*there is none: give --probe"),
        (
            {"preset": "lnog"},
            "lookaheadkv: unknown LookaheadKV preset 'lnog'; choose one of paper, pooled, long",
        ),
        (
            {"probe_weight": 0.5, "fusion": "unoin"},
            "lookaheadkv: fusion: fusion rule must be one of mixture, union",
        ),
        (
            {"probe_weight": 1.5},
            "lookaheadkv: probe_weight must be a number in \\(0, 1\\] \\(0: no probe\\), got 1.5",
        ),
        ({"fusion": "union"}, "lookaheadkv: fusion given without probe_weight > 0"),
        ({"kernel": 4}, "lookaheadkv: kernel must be an odd whole number ≥ 1, got 4"),
    ]:
        with pytest.raises(ValueError, match=said):
            lkv.commands.eval.evaluate(
                methods=("lookaheadkv",),
                adapter=folder,
                press_args={"lookaheadkv": own},
                output=str(tmp_path / "x"),
                **args,
            )
    # refused before run.json records the settings: the corrected command runs in the same folder
    assert not (tmp_path / "x").exists()


def test_a_module_fused_with_the_probe_scores_beside_both_on_one_prefill(tiny_corpus, tmp_path, monkeypatch):
    """``probe_weight`` in a named module's press_args evaluates LookaheadKV ⊕ probe as ``lookaheadkv:<name>``,
    on the prefill the module alone and the probe share; its answers are those of a FusedPress built by hand."""
    import lkv.eviction.presses.lookaheadkv
    from lkv.eviction.presses import FusedPress, LookaheadKVPress
    from lkv.eviction.presses.sentences import SentencePress, sentence_ends
    from lkv.model.lookahead import LookaheadAdapter
    from tests.conftest import build_tiny_model
    from tests.model.test_lookahead import perturb_lora

    model, tokenizer = build_tiny_model("llama")
    adapter = LookaheadAdapter.create(model, num_tokens=3)
    perturb_lora(adapter)
    adapter.save(tmp_path / "adapter")
    ImportanceProbe.create(model, hidden_dim=8, seed=0).save(tmp_path / "probe")
    monkeypatch.setattr(
        lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model("llama")
    )
    prefills = []
    monkeypatch.setattr(lkv.eval.prefill, "prefill", lambda *a, **k: prefills.append(1) or prefill(*a, **k))
    built, real_press = [], lkv.commands.eval_run.lookahead_press
    monkeypatch.setattr(
        lkv.commands.eval_run,
        "lookahead_press",
        lambda *a, **k: built.append(real_press(*a, **k)) or built[-1],
    )
    task = tiny_needle_task(tiny_corpus)
    folder = str(tmp_path / "adapter")
    beyond = 16  # the prompt's last 16 tokens stand alone, its earlier sentences stay whole
    lkv.commands.eval.evaluate(
        [task],
        methods=("lookaheadkv", "probe"),
        budgets=(8,),
        settings=("aware",),
        adapter=folder,
        adapters={"fused": folder, "union": folder, "sentences": folder},
        probe=str(tmp_path / "probe"),
        press_args={
            "lookaheadkv:fused": {"probe_weight": 0.5},
            "lookaheadkv:union": {"probe_weight": 0.5, "fusion": "union"},
            "lookaheadkv:sentences": {
                "probe_weight": 0.5,
                "fusion": "union",
                "sentences": 0.5,
                "sentences_beyond": beyond,
                "sentences_scaled": True,
            },
        },
        output=str(tmp_path / "out"),
        progress=False,
    )
    rows = {r["method"]: r for r in read_rows(tmp_path / "out")}
    named = {"lookaheadkv:fused", "lookaheadkv:union", "lookaheadkv:sentences"}
    assert set(rows) == {"lookaheadkv", "probe", *named} and len(prefills) == 1
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["press_args"]
    assert recorded["lookaheadkv:fused"] == {"kernel": DEFAULT_KERNEL, "probe_weight": 0.5}
    # the same answer from a fusion built by hand on a fresh model
    model, tokenizer = build_tiny_model("llama")
    lookahead = LookaheadKVPress.from_folder(folder, model, kernel=1)
    probe = ProbePress.from_folder(tmp_path / "probe", model)
    fused = FusedPress([lookahead, probe], [0.5, 0.5], DEFAULT_KERNEL)
    pooled = LookaheadKVPress(lookahead.adapter, DEFAULT_KERNEL)
    union = FusedPress([pooled, probe], [0.5, 0.5], rule="union")
    sentences = SentencePress(union, sentence_ends(tokenizer), 0.5, beyond, scaled=True)
    # the press eval built holds every setting (the tiny prompt's answer may not show a dropped one)
    (made,) = [press for press in built if isinstance(press, SentencePress)]
    assert (made.share, made.beyond, made.scaled) == (0.5, beyond, True)
    (sample,) = task.samples(tokenizer)
    context, question = encode_sample(sample, tokenizer)
    for method, press in [("lookaheadkv:fused", fused), ("lookaheadkv:sentences", sentences)]:
        compressor = Compressor(model, tokenizer, press, budget=8)
        answer = compressor.decode(compressor.compress(context + question), Sampling(task.max_new_tokens))
        assert rows[method]["answer_ids"] == answer.token_ids, method


def test_the_budget_column_formats_and_parses_back():
    for value in (64, 128, 0.25, 1.0, 0.001):
        budget = Budget(value)
        assert parse_budget_key(budget_key(budget)) == budget
    assert budget_key(Budget(128.0)) == "128" and budget_key(None) == FULL
    assert parse_budget_key(FULL) == FULL and parse_budget_key(NO_BUDGET) == NO_BUDGET
    keys = ["-", "full", "128", "0.25", "64", "1.0"]
    assert sorted(keys, key=budget_order) == ["0.25", "1.0", "64", "128", "full", "-"]
    with pytest.raises(ValueError, match="≥ 1 token per head"):
        parse_budget_key("0")


def test_probe_variants_each_score_with_their_own_folder_on_one_prefill(
    tiny_llama, tiny_corpus, tmp_path, monkeypatch
):
    """``probe:<name>`` variants (``press_args: {probe:<name>: {folder: ...}}``) score beside ``probe`` (its folder
    from ``--probe``) on the same prefill: one press per folder, run.json records each variant's folder and its
    fingerprint, and a variant on ``--probe``'s folder answers exactly as ``probe`` does."""
    model, _ = tiny_llama
    for seed in (0, 1):
        ImportanceProbe.create(model, hidden_dim=8, seed=seed).save(tmp_path / f"probe{seed}")
    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", lambda *a, **k: tiny_llama)
    loaded, from_folder = [], ProbePress.from_folder
    monkeypatch.setattr(
        ProbePress, "from_folder", lambda folder, net: loaded.append(str(folder)) or from_folder(folder, net)
    )
    prefills = []
    monkeypatch.setattr(lkv.eval.prefill, "prefill", lambda *a, **k: prefills.append(1) or prefill(*a, **k))
    first, second = str(tmp_path / "probe0"), str(tmp_path / "probe1")
    lkv.commands.eval.evaluate(
        [tiny_needle_task(tiny_corpus)],
        methods=("probe",),
        variants=("probe:s1", "probe:again"),
        budgets=(8,),
        settings=("aware",),
        probe=first,
        press_args={"probe:s1": {"folder": second}, "probe:again": {"folder": first}},
        output=str(tmp_path / "out"),
        progress=False,
    )
    rows = {r["method"]: r for r in read_rows(tmp_path / "out") if r["method"] != "fullkv"}
    assert set(rows) == {"probe", "probe:s1", "probe:again"} and len(prefills) == 1
    assert sorted(loaded) == [first, second]
    assert rows["probe:again"]["prediction"] == rows["probe"]["prediction"]
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["press_args"]
    assert recorded["probe:s1"] == {"folder": second, "fingerprint": fingerprint(second)}
    assert "probe" not in recorded  # --probe's fingerprint is run.json's "probe", as before
