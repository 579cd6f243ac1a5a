"""The Python API and `lkv generate`: budgets, prompts, both settings, sampling, stop strings."""

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

import lkv.commands.generate_run
import lkv.eviction.presses.lookaheadkv
from lkv.cli import main as lkv_main
from lkv.commands.generate import generate as generate_command
from lkv.core.generation import Sampling, append_tokens, prefill
from lkv.eviction.compressor import Compressor, encode_context, encode_question
from lkv.eviction.presses.lookaheadkv import DEFAULT_KERNEL
from lkv.eviction.registry import make_method
from lkv.eviction.selector import pool_scores
from tests.reference import evicted_reference_logits, greedy_steps, keep_mask


def ids_of(model, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 0}, "≥ 1"),
        ({"budget": -3}, "≥ 1"),
        ({"budget": 12.5}, "neither a ratio"),
        ({"budget": 1.5}, "neither a ratio"),
        ({"budget": -0.2}, "positive"),
    ],
)
def test_invalid_settings_fail_at_construction(tiny_llama, kwargs, match):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match=match):
        Compressor(model, tokenizer, "snapkv", **kwargs)


@pytest.mark.parametrize("empty", [[], torch.zeros(1, 0, dtype=torch.long), "", "   "])
def test_empty_prompt_is_refused(tiny_llama, empty):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match="empty"):
        Compressor(model, tokenizer, "snapkv").generate(empty)


def test_text_prompt_uses_the_chat_template(tiny_llama):
    model, tokenizer = tiny_llama
    text = "The special magic number for maple is 7321945."
    want = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    got = Compressor(model, tokenizer, "fullkv").encode(text)
    assert tokenizer.decode(got[0]) == want
    assert (
        encode_context(tokenizer, text) + encode_question(tokenizer, "Which?")
        == tokenizer(want.replace(text, text + "\n\nWhich?"), add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv", "fullkv"])
def test_question_agnostic_with_full_budget_equals_plain_generation(tiny_model, method):
    model, tokenizer = tiny_model
    context, question = ids_of(model, 40), ids_of(model, 9, seed=1)
    compressor = Compressor(
        model, tokenizer, make_method(method) if method == "fullkv" else method, budget=40
    )
    got = compressor.generate(context, Sampling(max_new_tokens=8), question=question)
    want = model.generate(torch.cat([context, question], 1), max_new_tokens=8, do_sample=False)[0, 49:]
    assert got.token_ids == want.tolist() and got.prompt_tokens == 49


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv"])
def test_question_agnostic_with_eviction_matches_masked_reference(tiny_llama, method):
    """The question is appended to the compressed context (positions from the full context length)."""
    model, tokenizer = tiny_llama
    context, question = ids_of(model, 40), ids_of(model, 7, seed=1)
    compressor = Compressor(model, tokenizer, make_method(method, window=4), budget=10)
    compressed = compressor.compress_context(context)
    out = compressor.answer(compressed, question, Sampling(max_new_tokens=3))
    assert [layer.get_seq_length() for layer in compressed.cache.layers] == compressed.kept_per_layer

    cache = copy.deepcopy(compressed.cache)
    next_logits = append_tokens(model, cache, question, 40)
    tokens, got = greedy_steps(model, cache, next_logits, 47, steps=3)
    want = evicted_reference_logits(
        model, torch.cat([context[0], question[0], tokens])[None], keep_mask(compressed.kept, 40)
    )
    torch.testing.assert_close(got, want[46:], atol=1e-4, rtol=0)
    assert out.token_ids == tokens.tolist()


def test_one_context_serves_several_questions(tiny_llama):
    model, tokenizer = tiny_llama
    compressor = Compressor(model, tokenizer, "snapkv", budget=0.5)
    context = compressor.compress_context("The special magic number for maple is 7321945. " * 4)
    before = [layer.keys.clone() for layer in context.cache.layers]
    first = compressor.answer(context, "What is the magic number?", Sampling(max_new_tokens=6))
    compressor.answer(context, "Something else entirely, please.", Sampling(max_new_tokens=6))
    again = compressor.answer(context, "What is the magic number?", Sampling(max_new_tokens=6))
    assert first.token_ids == again.token_ids
    for layer, keys in zip(context.cache.layers, before, strict=True):
        assert torch.equal(layer.keys, keys)


def test_sampling_is_seeded_and_top_p_small_is_greedy(tiny_llama):
    model, tokenizer = tiny_llama
    ids = ids_of(model, 30)
    compressor = Compressor(model, tokenizer, "streamingllm", budget=12)
    greedy = compressor.generate(ids, Sampling(max_new_tokens=12)).token_ids
    sampled = [
        compressor.generate(ids, Sampling(max_new_tokens=12, temperature=1.5, seed=s)).token_ids
        for s in (7, 7, 8)
    ]
    assert sampled[0] == sampled[1] != sampled[2]
    assert (
        compressor.generate(ids, Sampling(max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=3)).token_ids
        == greedy
    )
    with pytest.raises(ValueError, match="temperature"):
        compressor.generate(ids, Sampling(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        compressor.generate(ids, Sampling(temperature=1.0, top_p=0.0))


def test_stop_strings_end_and_cut_the_answer(tiny_llama):
    model, tokenizer = tiny_llama
    ids = ids_of(model, 30)
    compressor = Compressor(model, tokenizer, "streamingllm", budget=12)
    full = compressor.generate(ids, Sampling(max_new_tokens=16))
    assert full.finish_reason == "length" and len(full.token_ids) == 16
    stop = full.text[len(full.text) // 2 :][:2]
    out = compressor.generate(ids, Sampling(max_new_tokens=16, stop=[stop]))
    assert out.finish_reason == "stop" and len(out.token_ids) < 16
    assert out.text == full.text[: full.text.find(stop)]


def test_eos_ends_generation(tiny_llama):
    model, tokenizer = tiny_llama
    ids = ids_of(model, 30)
    first = Compressor(model, tokenizer, "fullkv").generate(ids, Sampling(max_new_tokens=1)).token_ids[0]
    model.generation_config.eos_token_id = first
    out = Compressor(model, tokenizer, "fullkv").generate(ids, Sampling(max_new_tokens=8))
    assert out.token_ids == [first] and out.finish_reason == "eos"


@pytest.fixture
def patched_backbone(monkeypatch, tiny_llama):
    model, tokenizer = tiny_llama
    calls = []

    def fake_load(name, **kwargs):
        calls.append(name)
        return model, tokenizer

    for module in (
        lkv.commands.generate_run,
        lkv.eviction.presses.lookaheadkv,
    ):  # the two places that load a model
        monkeypatch.setattr(module, "load_backbone", fake_load)
    return calls


def test_generate_command(patched_backbone, capsys):
    lkv_main(
        [
            "generate",
            "--prompt",
            "Tell me about foxes. " * 10,
            "--budget",
            "16",
            "--max_new_tokens",
            "5",
            "--press_args",
            '{"window": 8}',
        ]
    )
    out, err = capsys.readouterr()
    assert "kept 16 tokens per head" in err and "snapkv, budget 16," in err
    assert patched_backbone == ["smollm2-135m"]
    lkv_main(
        ["generate", "--prompt", "Foxes. " * 30, "--question", "Why?", "--method", "h2o", "--budget", "0.8"]
    )
    assert "h2o, budget 0.8," in capsys.readouterr().err


def test_generate_command_head_budget(patched_backbone, capsys):
    args = ["generate", "--prompt", "Tell me about foxes. " * 10, "--budget", "16", "--max_new_tokens", "3"]
    lkv_main([*args, "--method", "expected_attention", "--head_budget", "adaptive"])
    err = capsys.readouterr().err
    assert "expected_attention, budget 16, adaptive head budgets," in err and "kept 16 tokens per head" in err
    with pytest.raises(SystemExit):
        lkv_main([*args, "--head_budget", "per-head"])
    lkv_main([*args, "--method", "snapkv", "--head_budget", "threshold"])
    assert "snapkv, budget 16, threshold matched to the budget," in capsys.readouterr().err
    lkv_main([*args, "--method", "snapkv", "--head_budget", "threshold", "--threshold", "0.5"])
    assert "snapkv, budget 16, threshold 0.5," in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lkv_main([*args, "--threshold", "0.5"])
    assert "--threshold applies with --head_budget threshold" in capsys.readouterr().err


def test_generate_command_errors(patched_backbone, tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        generate_command()
    with pytest.raises(FileNotFoundError, match="prompt_file"):
        generate_command(prompt_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="neither a ratio"):
        generate_command(prompt="hi", budget=2.5)
    with pytest.raises(ValueError, match="--adapter"):
        generate_command(prompt="hi", method="lookaheadkv")
    assert patched_backbone == []


def test_generate_command_with_an_exported_adapter(
    patched_backbone, make_tiny_model, tmp_path, capsys, monkeypatch
):
    from lkv.eviction.presses.sentences import SentencePress
    from lkv.model.lookahead import LookaheadAdapter

    donor, _ = make_tiny_model("llama")
    LookaheadAdapter.create(donor, num_tokens=4, lora_rank=2).save(tmp_path / "adapter")
    generate_command(prompt="Foxes. " * 20, method="lookaheadkv", adapter=str(tmp_path / "adapter"), budget=8)
    assert "lookaheadkv, budget 8," in capsys.readouterr().err
    # --sentences wraps the module's press in a sentence share
    presses, real = [], lkv.commands.generate_run.Compressor
    monkeypatch.setattr(
        lkv.commands.generate_run,
        "Compressor",
        lambda net, tok, press, *a, **k: presses.append(press) or real(net, tok, press, *a, **k),
    )
    adapter = str(tmp_path / "adapter")
    generate_command(
        prompt="Foxes. " * 20,
        method="lookaheadkv",
        adapter=adapter,
        budget=8,
        sentences=0.5,
        sentences_beyond=6,
        sentences_scaled=True,
    )
    made = presses[-1]
    assert isinstance(made, SentencePress) and (made.share, made.beyond, made.scaled) == (0.5, 6, True)


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv", "oracle"])
def test_one_scoring_serves_every_budget(tiny_llama, method):
    model, tokenizer = tiny_llama
    ids = ids_of(model, 40)
    press = make_method(method, **({"response_tokens": 4} if method == "oracle" else {"window": 4}))
    scored = Compressor(model, tokenizer, press).score(ids)
    for budget in (8, 16, 0.5, 40):
        compressor = Compressor(model, tokenizer, press, budget=budget)
        reused, fresh = compressor.evict(scored), compressor.compress(ids)
        assert reused.kept_per_layer == fresh.kept_per_layer and reused.kv_bytes_kept == fresh.kv_bytes_kept
        for a, b in zip(reused.cache.layers, fresh.cache.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert (
            compressor.decode(reused, Sampling(5)).token_ids
            == compressor.decode(fresh, Sampling(5)).token_ids
        )
    assert scored.cache.get_seq_length() == 40


@pytest.mark.slow
def test_embedded_model_finds_the_needle_with_full_cache():
    """SmolLM2-135M answers a ~2K-token needle-in-a-haystack prompt with FullKV (scripts/niah_smoke.py)."""
    spec = importlib.util.spec_from_file_location(
        "niah_smoke", Path(__file__).parents[2] / "scripts" / "niah_smoke.py"
    )
    niah = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(niah)
    model, tokenizer = lkv.model.backbone.load_backbone()
    context, question, number = niah.needle_prompt(tokenizer, tokens=2000, depth=0.5)
    out = Compressor(model, tokenizer, "fullkv").generate(
        f"{context}\n\n{question}", Sampling(max_new_tokens=32)
    )
    assert out.prompt_tokens > 2000 and number in out.text, out.text


def test_lookahead_from_a_training_checkpoint(monkeypatch, make_tiny_model, tmp_path):
    """``--adapter last.ckpt``: exported beside the checkpoint, the folder names its base model, and its
    trained weights score the prompt."""
    import lightning

    import lkv.train.module
    from lkv.eviction.presses.lookaheadkv import load_lookahead
    from lkv.train.export import resolve_adapter
    from lkv.train.module import LookaheadKVModule

    loaded = []

    def load_tiny(model, **kw):
        loaded.append(model)
        return make_tiny_model("llama")

    monkeypatch.setattr(lkv.train.module, "load_backbone", load_tiny)
    monkeypatch.setattr(lkv.eviction.presses.lookaheadkv, "load_backbone", load_tiny)
    module = LookaheadKVModule(model="tiny", num_lookahead=4, lora_rank=2)
    module.configure_model()
    generator = torch.Generator().manual_seed(0)
    for param in module.adapter.trainable_parameters().values():
        param.data.copy_(0.3 * torch.randn(param.shape, generator=generator))
    checkpoint = {
        "state_dict": module.state_dict(),
        "hyper_parameters": dict(module.hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "last.ckpt")

    folder = resolve_adapter(tmp_path / "last.ckpt")
    assert folder == tmp_path / "last-adapter"
    model, tokenizer, press = load_lookahead(folder)
    assert loaded[-1] == "tiny"  # the checkpoint's base model, named by the exported folder
    assert model is not module.adapter.model.get_base_model()
    ids = ids_of(model, 30)
    got = Compressor(model, tokenizer, press, budget=8).compress(ids).scores
    want = module.adapter.predict(prefill(module.adapter.model, ids)[0], 30)
    torch.testing.assert_close(
        got, pool_scores(want, DEFAULT_KERNEL, "max"), atol=1e-6, rtol=0
    )  # pooled default
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve_adapter(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not an `lkv export` folder"):
        load_lookahead(tmp_path / "last.ckpt")
