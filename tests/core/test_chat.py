"""Chat-template variables reach every path that renders a prompt: thinking is off unless asked for.

With a Qwen3-style template (``tests.conftest.THINKING_TEMPLATE``) a prompt rendered with thinking off ends with
an empty think block, so the model answers at once; rendered without the variable it ends with the bare
assistant header and Qwen3 starts reasoning. Labels (question-aware and -agnostic), evaluation prompts and
the Compressor's text paths must all render the first way, or the eval prompts differ from the labels'.
"""

from __future__ import annotations

import pytest
import torch

from lkv.core.chat import chat_parts, encode_context, encode_question, template_reads_variables
from lkv.eval.tasks import encode_sample
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress
from lkv.labels.labeller import split_prompt
from lkv.labels.prompts import Prompt, render_prompt
from tests.conftest import EMPTY_THINK, build_tiny_model, tiny_needle_task


def ends_with_empty_think(tokenizer, ids) -> bool:
    return tokenizer.decode(list(ids)).endswith("<|im_start|>assistant\n" + EMPTY_THINK)


def test_chat_parts_close_an_empty_think_block_unless_thinking_is_on(thinking_tokenizer):
    _, suffix = chat_parts(thinking_tokenizer)
    assert suffix.endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    _, thinking = chat_parts(thinking_tokenizer, enable_thinking=True)
    assert thinking.endswith("<|im_start|>assistant\n") and EMPTY_THINK not in thinking
    assert ends_with_empty_think(thinking_tokenizer, encode_question(thinking_tokenizer, "Which?"))
    assert not ends_with_empty_think(
        thinking_tokenizer, encode_question(thinking_tokenizer, "Which?", enable_thinking=True)
    )
    assert encode_context(thinking_tokenizer, "text") == encode_context(
        thinking_tokenizer, "text", enable_thinking=True
    )  # the switch lives in the assistant turn only


def test_template_reads_variables_tells_qwen3_from_other_templates(thinking_tokenizer, tiny_tokenizer):
    assert template_reads_variables(thinking_tokenizer)
    assert not template_reads_variables(tiny_tokenizer)


def test_eval_samples_render_with_thinking_off(thinking_tokenizer, tiny_corpus):
    task = tiny_needle_task(tiny_corpus, lengths=(40,))
    (sample,) = task.samples(thinking_tokenizer)
    _, question = encode_sample(sample, thinking_tokenizer)
    # the template's closing, then RULER's answer prefix opening the assistant's turn
    want = "<|im_start|>assistant\n" + EMPTY_THINK + sample.answer_prefix
    assert thinking_tokenizer.decode(question).endswith(want)
    _, thinking = encode_sample(sample, thinking_tokenizer, enable_thinking=True)
    assert EMPTY_THINK not in thinking_tokenizer.decode(thinking)


def test_compressor_text_paths_render_with_thinking_off(thinking_tokenizer):
    model, _ = build_tiny_model("qwen")
    compressor = Compressor(model, thinking_tokenizer, "fullkv")
    assert ends_with_empty_think(thinking_tokenizer, compressor.encode("Where is the key?")[0])
    messages = [{"role": "user", "content": "Where is the key?"}]
    assert ends_with_empty_think(thinking_tokenizer, compressor.encode(messages)[0])
    # question-agnostic: the question's tokens close the turn; they are what `answer` appends
    seen = []
    real = Compressor.answer

    def spy(self, context, question, sampling=None):
        seen.append(encode_question(self.tokenizer, question, enable_thinking=self.enable_thinking))
        return real(self, context, question)

    compressor.answer = spy.__get__(compressor)
    compressor.generate("A long context.", question="Where is the key?")
    assert ends_with_empty_think(thinking_tokenizer, seen[0])
    on = Compressor(model, thinking_tokenizer, "fullkv", enable_thinking=True)
    assert not ends_with_empty_think(thinking_tokenizer, on.encode("Where is the key?")[0])


def test_compressor_appends_the_question_rendered_with_thinking_off(thinking_tokenizer):
    model, _ = build_tiny_model("qwen")
    compressor = Compressor(model, thinking_tokenizer, "fullkv")
    context = compressor.compress_context("A long context about keys.")
    by_text = compressor.answer(context, "Where is the key?")
    by_ids = compressor.answer(context, encode_question(thinking_tokenizer, "Where is the key?"))
    assert by_text.token_ids == by_ids.token_ids and by_text.prompt_tokens == by_ids.prompt_tokens
    assert by_text.prompt_tokens == context.prompt_len + len(
        encode_question(thinking_tokenizer, "Where is the key?")
    )


def test_labels_render_with_thinking_off_in_both_modes(thinking_tokenizer):
    prompt = Prompt(
        "p", [{"role": "user", "content": "Some text.\n\nWhat is it?"}], "test", "doc", "question"
    )
    assert ends_with_empty_think(thinking_tokenizer, render_prompt(prompt, thinking_tokenizer, 1000))
    on = render_prompt(prompt, thinking_tokenizer, 1000, enable_thinking=True)
    assert not ends_with_empty_think(thinking_tokenizer, on)
    # question-agnostic labels cut the prompt where agnostic evaluation does, thinking off there too
    context, question = split_prompt(
        thinking_tokenizer, "Some text.\n\nWhat is it?", "What is it?", 1000, "error"
    )
    assert ends_with_empty_think(thinking_tokenizer, question)
    assert context + question == render_prompt(prompt, thinking_tokenizer, 1000)
    _, thinking = split_prompt(
        thinking_tokenizer, "Some text.\n\nWhat is it?", "What is it?", 1000, "error", enable_thinking=True
    )
    assert not ends_with_empty_think(thinking_tokenizer, thinking)


def test_evaluator_prefills_prompts_rendered_with_thinking_off(thinking_tokenizer, tiny_corpus, tmp_path):
    import lkv.eval.run_end_task
    from lkv.eval.runner import Evaluator

    model, _ = build_tiny_model("qwen")
    task = tiny_needle_task(tiny_corpus, lengths=(40,), max_new_tokens=2)
    (sample,) = task.samples(thinking_tokenizer)
    prefilled: list[torch.Tensor] = []
    real = lkv.eval.run_end_task.shared_prefill
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            lkv.eval.run_end_task,
            "shared_prefill",
            lambda m, ids, p: prefilled.append(ids) or real(m, ids, p),
        )
        for thinking in (False, True):
            evaluator = Evaluator(
                model,
                thinking_tokenizer,
                {"fullkv": FullKVPress()},
                [8],
                ["aware"],
                tmp_path / str(thinking),
                progress=False,
                enable_thinking=thinking,
            )
            evaluator.run([task])
    off, on = (thinking_tokenizer.decode(ids[0].tolist()) for ids in prefilled)
    assert off.endswith(EMPTY_THINK + sample.answer_prefix)
    assert EMPTY_THINK not in on


def test_generate_command_renders_with_thinking_off_unless_asked(thinking_tokenizer, monkeypatch, capsys):
    import lkv.commands.generate_run
    from lkv.cli import main

    model, _ = build_tiny_model("qwen")
    monkeypatch.setattr(
        lkv.commands.generate_run, "load_backbone", lambda name, **kw: (model, thinking_tokenizer)
    )
    encoded = []
    real = Compressor.encode

    def text_encodings(self, prompt):  # the rendered text prompts (their ids are passed on as they are)
        ids = real(self, prompt)
        if isinstance(prompt, str):
            encoded.append(ids)
        return ids

    monkeypatch.setattr(Compressor, "encode", text_encodings)
    args = ["generate", "--prompt", "Where is the key? " * 5, "--method", "fullkv", "--max_new_tokens", "2"]
    main(args)
    main([*args, "--enable_thinking", "true"])
    capsys.readouterr()
    assert ends_with_empty_think(thinking_tokenizer, encoded[0][0])
    assert not ends_with_empty_think(thinking_tokenizer, encoded[1][0])


@pytest.fixture
def eval_args(tiny_corpus, tmp_path):
    def args(model_folder, **kwargs):
        task = tiny_needle_task(tiny_corpus, lengths=(40,), max_new_tokens=2)
        settings = dict(
            tasks=[task],
            methods=("fullkv",),
            budgets=(8,),
            settings=("aware",),
            output=str(tmp_path / "eval"),
            model=str(model_folder),
            progress=False,
        )
        return {**settings, **kwargs}

    return args


def save(model, tokenizer, folder):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_eval_records_the_template_variables_and_refuses_other_ones(thinking_tokenizer, eval_args, tmp_path):
    import json

    import lkv.commands.eval

    folder = save(build_tiny_model("qwen")[0], thinking_tokenizer, tmp_path / "qwen")
    lkv.commands.eval.evaluate(**eval_args(folder))
    run = json.loads((tmp_path / "eval" / "run.json").read_text())
    assert run["chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(ValueError, match="differs in: chat_template_kwargs"):
        lkv.commands.eval.evaluate(**eval_args(folder, enable_thinking=True))


@pytest.mark.parametrize("reads", [True, False])
def test_a_folder_from_before_the_record_resumes_only_if_the_template_ignores_it(
    thinking_tokenizer, tiny_tokenizer, eval_args, tmp_path, reads
):
    import json

    import lkv.commands.eval

    tokenizer = thinking_tokenizer if reads else tiny_tokenizer
    folder = save(build_tiny_model("qwen")[0], tokenizer, tmp_path / "qwen")
    lkv.commands.eval.evaluate(**eval_args(folder))
    run_file = tmp_path / "eval" / "run.json"
    old = json.loads(run_file.read_text())
    del old["chat_template_kwargs"]  # as written before run.json recorded it
    run_file.write_text(json.dumps(old))
    if reads:
        with pytest.raises(ValueError, match="from before run.json recorded chat_template_kwargs"):
            lkv.commands.eval.evaluate(**eval_args(folder))
        assert "chat_template_kwargs" not in json.loads(run_file.read_text())
    else:  # SmolLM2's and Llama 3's templates: the prompts were the same, so the folder resumes
        lkv.commands.eval.evaluate(**eval_args(folder))
        assert json.loads(run_file.read_text())["chat_template_kwargs"] == {"enable_thinking": False}
