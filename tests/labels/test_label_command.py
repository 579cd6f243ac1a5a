"""`lkv label` end to end on a tiny model saved to disk: the Lightning predict loop, shards, resumption."""

import json
import shutil

import pytest
import torch

from lkv.cli import main
from lkv.commands.label import label
from lkv.core.generation import eos_ids
from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.dataset_prompts import HFDatasetPrompts, JsonlPrompts
from lkv.labels.labeller import label_prompt
from lkv.labels.prompts import render_prompt
from lkv.labels.shards import load_labels, read_meta, row_scores
from lkv.model.backbone import load_backbone
from tests.conftest import THINKING_TEMPLATE


@pytest.fixture
def saved_model(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "prompts.jsonl"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    lines = [
        {"id": f"q{i}", "prompt": " ".join(words[(i + j) % len(words)] for j in range(10 + 3 * i))}
        for i in range(5)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def run(saved_model, jsonl, output, **kwargs):
    return label(
        output=str(output),
        prompts=JsonlPrompts(str(jsonl), id_field="id"),
        model=str(saved_model),
        response_tokens=5,
        max_prompt_tokens=256,
        score_dtype="float32",
        shard_size=2,
        accelerator="cpu",
        progress=False,
        **kwargs,
    )


def test_label_writes_every_prompt_once_and_matches_the_core(saved_model, jsonl, tmp_path):
    out = tmp_path / "labels"
    run(saved_model, jsonl, out)
    data = load_labels(out)
    assert sorted(data["id"]) == [f"q{i}" for i in range(5)]
    meta = read_meta(out)
    assert (meta.response_tokens, meta.store_scores) == (5, True)
    model, tokenizer = load_backbone(str(saved_model))
    assert meta.model["num_layers"] == model.config.num_hidden_layers
    prompts = {p.id: p for p in JsonlPrompts(str(jsonl), id_field="id")}
    for row in data:
        ids = render_prompt(prompts[row["id"]], tokenizer, 256)
        assert row["prompt_ids"] == ids
        want = label_prompt(model, ids, 5, eos_ids(model, tokenizer))
        assert row["response_ids"] == want.response_ids
        torch.testing.assert_close(row_scores(row, meta), want.scores, atol=1e-6, rtol=0)


def test_rerun_skips_finished_and_refuses_other_settings(saved_model, jsonl, tmp_path, capsys):
    out = tmp_path / "labels"
    run(saved_model, jsonl, out)
    run(saved_model, jsonl, out)
    assert "5 already labelled, 0 to go" in capsys.readouterr().out
    assert len(load_labels(out)) == 5
    with pytest.raises(ValueError, match="response_tokens"):
        label(output=str(out), prompts=JsonlPrompts(str(jsonl), id_field="id"), model=str(saved_model))


def test_a_larger_num_prompts_grows_the_folder_and_other_prompts_are_refused(
    saved_model, tiny_corpus, tmp_path, capsys
):
    essays, stdlib = tiny_corpus

    def grow(output, num_prompts, **settings):
        source = BuiltinPrompts(
            num_prompts=num_prompts,
            min_words=40,
            max_words=80,
            essays_dir=str(essays),
            stdlib_dir=str(stdlib),
            heldout_fraction=0.5,
            **settings,
        )
        kwargs = {"response_tokens": 4, "max_prompt_tokens": 256, "accelerator": "cpu", "progress": False}
        return label(output=str(output), prompts=source, model=str(saved_model), **kwargs)

    grow(tmp_path / "grown", 2)
    grow(tmp_path / "grown", 4)
    assert "2 already labelled, 2 to go" in capsys.readouterr().out
    assert "num_prompts=4" in read_meta(tmp_path / "grown").prompt_source
    grow(tmp_path / "whole", 4)
    grown, whole = load_labels(tmp_path / "grown"), load_labels(tmp_path / "whole")
    assert sorted(grown["id"]) == sorted(whole["id"]) and len(grown) == 4
    by_id = {row["id"]: row for row in whole}
    assert all(row["scores"] == by_id[row["id"]]["scores"] for row in grown)
    # fewer prompts of the source are all labelled already: nothing to do, the folder is untouched; other
    # prompts are refused before any model is loaded
    before = (tmp_path / "grown" / "meta.json").read_text()
    grow(tmp_path / "grown", 3)
    assert "3 prompts, 4 already labelled, 0 to go" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"grown already holds labels of the prompts BuiltinPrompts"):
        grow(tmp_path / "grown", 6, seed=1)
    assert (tmp_path / "grown" / "meta.json").read_text() == before


def test_a_prompt_source_extends_the_first_prompts_of_itself():
    def hf(limit):
        return HFDatasetPrompts("some/dataset", field="text", limit=limit)

    assert hf(10).extends(hf(10).describe()) and hf(20).extends(hf(10).describe())
    assert hf(None).extends(hf(10).describe())  # no limit: every record, the first 10 among them
    assert not hf(5).extends(hf(10).describe()) and not hf(10).extends(hf(None).describe())
    other = HFDatasetPrompts("some/dataset", field="question", limit=20)
    assert not other.extends(hf(10).describe())
    jsonl = JsonlPrompts("a.jsonl")  # no count setting: only the same file
    assert jsonl.extends(jsonl.describe()) and not jsonl.extends(JsonlPrompts("b.jsonl").describe())


def test_interrupted_run_resumes_without_duplicates_or_gaps(saved_model, jsonl, tmp_path, monkeypatch):
    import lkv.labels.predict as predict

    real, calls = predict.label_batch, []

    def dies_on_the_fifth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("crash")  # the run dies mid-way, before its last shard is flushed
        return real(*args, **kwargs)

    monkeypatch.setattr(predict, "label_batch", dies_on_the_fifth)
    with pytest.raises(RuntimeError, match="crash"):
        run(saved_model, jsonl, tmp_path / "cut")
    # shard_size 2: four samples reached finished shards, the fifth was lost with the process.
    assert sorted(load_labels(tmp_path / "cut")["id"]) == ["q0", "q1", "q2", "q3"]
    monkeypatch.setattr(predict, "label_batch", real)
    run(saved_model, jsonl, tmp_path / "cut")
    run(saved_model, jsonl, tmp_path / "whole")
    resumed, whole = load_labels(tmp_path / "cut"), load_labels(tmp_path / "whole")
    assert sorted(resumed["id"]) == sorted(whole["id"]) == [f"q{i}" for i in range(5)]
    by_id = {row["id"]: row for row in whole}
    for row in resumed:
        assert (row["response_ids"], row["scores"]) == (
            by_id[row["id"]]["response_ids"],
            by_id[row["id"]]["scores"],
        )


def test_cli_verb_with_a_config_file(saved_model, jsonl, tmp_path, capsys):
    config = tmp_path / "label.yaml"
    config.write_text(
        f"output: {tmp_path / 'cli'}\nmodel: {saved_model}\nresponse_tokens: 3\nprogress: false\n"
        f"accelerator: cpu\nprompts:\n  class_path: lkv.labels.dataset_prompts.JsonlPrompts\n"
        f"  init_args:\n    path: {jsonl}\n    id_field: id\n"
    )
    main(["label", "--config", str(config)])
    assert "5 labelled prompts" in capsys.readouterr().out
    assert read_meta(tmp_path / "cli").response_tokens == 3


def test_scores_are_float32_unless_asked_and_a_float16_folder_resumes_as_float16(
    saved_model, jsonl, tmp_path
):
    # float16 cannot rank long prompts' scores (most lie below its smallest normal at S = 16K); folders
    # written as float16 before stay readable and resumable without naming the dtype
    settings = {"prompts": JsonlPrompts(str(jsonl), id_field="id"), "model": str(saved_model)}
    settings.update(response_tokens=5, max_prompt_tokens=256, accelerator="cpu", progress=False)
    label(output=str(tmp_path / "new"), **settings)
    assert read_meta(tmp_path / "new").score_dtype == "float32"
    old = tmp_path / "old"
    label(output=str(old), score_dtype="float16", shard_size=2, **settings)
    (old / "labels-r000-00002.parquet").unlink()  # the last prompt is left to do
    label(output=str(old), shard_size=2, **settings)
    assert read_meta(old).score_dtype == "float16" and len(load_labels(old)) == 5
    for row in load_labels(old):
        sums = row_scores(row, read_meta(old)).sum(-1)
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-2, rtol=0)


def test_agnostic_labels_hold_the_context_and_skip_prompts_without_a_trailing_question(
    saved_model, tiny_corpus, tmp_path
):
    from lkv.labels.builtin_prompts import BuiltinPrompts
    from lkv.labels.labeller import split_prompt

    essays, stdlib = tiny_corpus
    prompts = BuiltinPrompts(
        num_prompts=12,
        min_words=40,
        max_words=80,
        heldout_fraction=0.5,
        essays_dir=str(essays),
        stdlib_dir=str(stdlib),
    )
    out = tmp_path / "agnostic"
    settings = {
        "output": str(out),
        "prompts": prompts,
        "model": str(saved_model),
        "response_tokens": 4,
        "max_prompt_tokens": 512,
        "score_dtype": "float32",
    }
    label(**settings, accelerator="cpu", progress=False, label_mode="agnostic")
    data = load_labels(out)
    meta = read_meta(out)
    assert meta.extra["setting"] == "agnostic" and meta.extra["question_reduction"] == "max"
    with_question = {p.id: p for p in prompts if "question" in p.meta}
    assert 0 < len(with_question) < 12 and sorted(data["id"]) == sorted(
        with_question
    )  # instruction-first skipped
    model, tokenizer = load_backbone(str(saved_model))
    for row in data:
        prompt = with_question[row["id"]]
        context, question = split_prompt(
            tokenizer, prompt.messages[0]["content"], prompt.meta["question"], 512, "middle"
        )
        assert row["prompt_ids"] == context
        want = label_prompt(model, context, 4, eos_ids(model, tokenizer), question_ids=question)
        torch.testing.assert_close(row_scores(row, meta), want.scores, atol=1e-6, rtol=0)
    with pytest.raises(
        ValueError,
        match=r"setting=\{'setting': 'agnostic', 'question_reduction': 'max'\}, this run asks for \{'setting': 'aware'\}",
    ):
        label(**settings)  # the same folder, the default mode
    with pytest.raises(ValueError, match="needs --store_scores true"):
        label(
            output=str(tmp_path / "x"),
            prompts=prompts,
            model=str(saved_model),
            label_mode="agnostic",
            store_scores=False,
        )


def test_batched_run_writes_batch_one_labels(saved_model, jsonl, tmp_path, capsys):
    run(saved_model, jsonl, tmp_path / "one")
    run(saved_model, jsonl, tmp_path / "three", batch_size=3)
    out = capsys.readouterr().out
    assert "batches of 3, padding" in out
    one = {row["id"]: row for row in load_labels(tmp_path / "one")}
    three = load_labels(tmp_path / "three")
    assert sorted(three["id"]) == sorted(one)
    for row in three:
        assert row["response_ids"] == one[row["id"]]["response_ids"]
        torch.testing.assert_close(
            torch.tensor(row["scores"]), torch.tensor(one[row["id"]]["scores"]), atol=1e-5, rtol=0
        )


def write_responses(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_responses_from_another_engine(saved_model, jsonl, tmp_path):
    """Responses given as token ids (with the EOS) or as text give the labels of generating them here."""
    run(saved_model, jsonl, tmp_path / "generated")
    generated = load_labels(tmp_path / "generated")
    _, tokenizer = load_backbone(str(saved_model))
    records = []
    for i, row in enumerate(generated):
        if i % 2:
            records.append(
                {"id": row["id"], "response_ids": row["response_ids"], "prompt_ids": row["prompt_ids"]}
            )
        else:  # text: the response without a trailing EOS (special tokens are not part of the text)
            text = tokenizer.decode(row["response_ids"], skip_special_tokens=True)
            assert tokenizer(text, add_special_tokens=False)["input_ids"] == row["response_ids"]
            records.append({"id": row["id"], "response": text})
    responses = write_responses(tmp_path / "vllm.jsonl", records + [{"id": "unused", "response": "x"}])
    run(saved_model, jsonl, tmp_path / "engine", responses=str(responses))
    meta = read_meta(tmp_path / "engine")
    assert meta.extra["responses"]["file"] == str(responses.resolve())
    assert meta.extra["responses"]["records"] == 6 and len(meta.extra["responses"]["sha256"]) == 64
    want = {row["id"]: row for row in generated}
    for row in load_labels(tmp_path / "engine"):
        assert row["response_ids"] == want[row["id"]]["response_ids"]
        torch.testing.assert_close(
            torch.tensor(row["scores"]), torch.tensor(want[row["id"]]["scores"]), atol=1e-6, rtol=0
        )
    # rerunning with another responses file is another run
    other = write_responses(tmp_path / "other.jsonl", records)
    with pytest.raises(ValueError, match="responses"):
        run(saved_model, jsonl, tmp_path / "engine", responses=str(other))


def test_responses_that_do_not_fit_are_refused(saved_model, jsonl, tmp_path):
    _, tokenizer = load_backbone(str(saved_model))
    good = [{"id": f"q{i}", "response": "a"} for i in range(5)]

    def refused(records, match, before_labelling=True):
        path = write_responses(tmp_path / "responses.jsonl", records)
        with pytest.raises(ValueError, match=match):
            run(saved_model, jsonl, tmp_path / "out", responses=str(path))
        # file-level checks run before the loop starts; the prompt check when the prompt is rendered
        assert (tmp_path / "out").exists() != before_labelling
        shutil.rmtree(tmp_path / "out", ignore_errors=True)

    refused(good[:3] + good[4:], r"no response for 1 prompt\(s\), e\.g\. id 'q3'")
    # one token per character: "startup" decodes fine but the tokenizer would merge it into fewer tokens
    split = [tokenizer.convert_tokens_to_ids(c) for c in "startup"]
    assert tokenizer(tokenizer.decode(split), add_special_tokens=False)["input_ids"] != split
    refused(good[:4] + [{"id": "q4", "response_ids": split}], r"responses.jsonl:5 \(id 'q4'\).*round-trip")
    refused(good[:4] + [{"id": "q4", "response_ids": [10**6]}], "outside the vocabulary")
    refused(good[:4] + [{"id": "q4", "response": "alpha " * 10}], "over --response_tokens 5")
    refused(good[:4] + [{"id": "q4", "response": "a", "prompt_ids": [1, 2, 3]}], "'prompt_ids' differ", False)
    refused(good + [{"id": "q4", "response": "again"}], "already has a response")


def test_labeller_loads_straight_onto_its_ranks_device(saved_model):
    """configure_model runs while the module's own device is still the CPU; the weights must go to the
    strategy's root device directly. ``meta`` stands in for ``cuda:k``: any CPU copy would show as CPU tensors."""
    from types import SimpleNamespace

    from lkv.labels.predict import LabelingModule

    module = LabelingModule(model=str(saved_model))
    module._trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("meta")))
    module.configure_model()
    assert {p.device.type for p in module.backbone.parameters()} == {"meta"}


def test_load_backbone_reads_weights_onto_the_device(saved_model, monkeypatch):
    """The device reaches transformers' loader (``device_map``) instead of a move after a CPU load."""
    import lkv.model.backbone

    seen = []
    real = lkv.model.backbone.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device_map"))
        return real(*args, **kwargs)

    monkeypatch.setattr(lkv.model.backbone.AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = load_backbone(str(saved_model), device="meta")
    assert seen == ["meta"]
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_labels_render_the_chat_template_with_thinking_off(tiny_llama, jsonl, tmp_path):
    model, tokenizer = tiny_llama
    tokenizer.chat_template = THINKING_TEMPLATE
    folder = tmp_path / "qwen-like"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    off, on = tmp_path / "off", tmp_path / "on"
    run(folder, jsonl, off)
    run(folder, jsonl, on, enable_thinking=True)
    think = tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    for row in load_labels(off):
        assert row["prompt_ids"][-len(think) :] == think
    for row in load_labels(on):
        assert row["prompt_ids"][-len(think) :] != think
    assert read_meta(off).extra["chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        run(folder, jsonl, off, enable_thinking=True)


def test_gold_answers_replace_only_the_wrong_answers(saved_model, jsonl, tmp_path, capsys):
    """A response holding its prompt's answer, a prompt without one, and one whose answer is not in the
    prompt as rendered keep the generated labels; a response missing the answer is replaced by the sentence
    stating it (else the answer), labelled as a given response of that text."""
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for i in (2, 4):  # the prompts that state q2's and q4's answer
        records[i]["prompt"] += " The word is zeta theta."
    stated = tmp_path / "stated.jsonl"
    stated.write_text("".join(json.dumps(record) + "\n" for record in records))
    run(saved_model, stated, tmp_path / "generated")
    generated = {row["id"]: row for row in load_labels(tmp_path / "generated")}
    _, tokenizer = load_backbone(str(saved_model))
    # q1 answered right: its answer is what it generated (a random model's text, whatever it is)
    records[1]["answer"] = tokenizer.decode(generated["q1"]["response_ids"])
    records[2]["answer"] = records[4]["answer"] = "zeta theta"  # q2, q4 answered wrong (not generated)
    records[4]["evidence"] = "The word is zeta theta."  # q4 names the sentence that states its answer
    records[3]["answer"] = "omega psi"  # q3's answer is not in its prompt (as if truncation had cut it)
    assert all(
        answer not in tokenizer.decode(generated[f"q{i}"]["response_ids"])
        for i, answer in ((2, "zeta theta"), (3, "omega psi"), (4, "zeta theta"))
    )
    with_answers = tmp_path / "answers.jsonl"
    with_answers.write_text("".join(json.dumps(record) + "\n" for record in records))
    run(saved_model, with_answers, tmp_path / "gold", gold_answers=True)
    out = capsys.readouterr().out
    assert (
        "3 of 4 generated answers missed the prompt's answer; the reference response was teacher-forced "
        "in place of 2 (--gold_answers); 1 keep theirs, their answer not in the prompt as rendered"
    ) in out
    assert read_meta(tmp_path / "gold").extra["gold_answers"] is True
    eos = tokenizer.eos_token_id
    given = [{"id": f"q{i}", "response_ids": generated[f"q{i}"]["response_ids"]} for i in (0, 1, 3)]
    for i, text in ((2, "zeta theta"), (4, "The word is zeta theta.")):  # R - 1 = 4 tokens, then the EOS
        given.append({"id": f"q{i}", "response_ids": tokenizer(text).input_ids[:4] + [eos]})
    responses = write_responses(tmp_path / "right.jsonl", given)
    run(saved_model, with_answers, tmp_path / "teacher_forced", responses=str(responses))
    want = {row["id"]: row for row in load_labels(tmp_path / "teacher_forced")}
    for row in load_labels(tmp_path / "gold"):
        assert row["response_ids"] == want[row["id"]]["response_ids"]
        assert (row["response_ids"] == generated[row["id"]]["response_ids"]) == (
            row["id"] not in ("q2", "q4")
        )
        torch.testing.assert_close(
            torch.tensor(row["scores"]), torch.tensor(want[row["id"]]["scores"]), atol=1e-6, rtol=0
        )
    with pytest.raises(ValueError, match="gold_answers"):  # a folder of gold answers resumes only with them
        run(saved_model, with_answers, tmp_path / "gold")
    for other in ({"responses": str(responses)}, {"label_mode": "agnostic"}):
        with pytest.raises(ValueError, match="--gold_answers replaces wrong answers"):
            run(saved_model, with_answers, tmp_path / "refused", gold_answers=True, **other)
