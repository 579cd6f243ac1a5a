"""Lookahead module: selectivity, gradients, exactness against a full eager forward, save/load."""

import pytest
import torch
from peft import PeftModel

from lkv.core.generation import prefill
from lkv.core.metrics import importance_kl
from lkv.model.lookahead import CONFIG_FILE, LookaheadAdapter
from lkv.model.tokens import INITS, init_embeddings


def random_prompt(model, length: int = 24, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=gen)


def perturb_lora(adapter: LookaheadAdapter, seed: int = 1, scale: float = 0.5) -> None:
    """Give every LoRA B (zero at creation) random values, so the adapter really changes the model."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter.trainable_parameters().items():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def cache_tensors(cache) -> list[torch.Tensor]:
    return [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]


def test_prompt_cache_is_bit_identical_with_the_adapter_loaded(tiny_model):
    model, _ = tiny_model
    ids = random_prompt(model)
    base_cache, base_logits = prefill(model, ids)
    base = cache_tensors(base_cache)
    adapter = LookaheadAdapter.create(model, num_tokens=4)
    perturb_lora(adapter)
    cache, logits = prefill(adapter.model, ids)
    assert all(torch.equal(a, b) for a, b in zip(base, cache_tensors(cache), strict=True))
    assert torch.equal(logits, base_logits)
    with torch.no_grad():
        adapter.predict(cache, ids.shape[1])
    # predict leaves the prompt's cache exactly as it found it, and the adapter off
    assert cache.get_seq_length() == ids.shape[1]
    assert all(torch.equal(a, b) for a, b in zip(base, cache_tensors(cache), strict=True))
    assert torch.equal(prefill(adapter.model, ids)[1], base_logits)


def test_adapter_changes_only_the_lookahead_tokens_predictions(tiny_llama):
    model, _ = tiny_llama
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=4)
    with torch.no_grad():
        before = adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1])
        perturb_lora(adapter)
        after = adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1])
    assert (before - after).abs().max() > 1e-3


def test_gradients_reach_only_lookahead_embeddings_and_lora(tiny_model):
    model, _ = tiny_model
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=4)
    perturb_lora(adapter)  # with B = 0, LoRA A gets an exactly zero gradient
    trainable = adapter.trainable_parameters()
    assert "embeddings" in trainable
    # all-linear: q,k,v,o,gate,up,down in every layer but the last, whose scores depend on its q/k only
    # (its v, o and MLP could never influence the loss); A and B each; never lm_head
    assert len(trainable) == 1 + (model.config.num_hidden_layers * 7 - 5) * 2
    assert not any("lm_head" in name for name in trainable)
    cache, _ = prefill(adapter.model, ids)
    pred = adapter.predict(cache, ids.shape[1])
    target = torch.softmax(torch.randn(pred.shape), dim=-1)
    importance_kl(target, pred).mean().backward()
    # every trainable weight gets a gradient: DDP needs no search for unused parameters
    for name, p in adapter.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
        assert p.requires_grad == (name in trainable), name


@pytest.mark.parametrize("targets", ["none", []])
def test_embeddings_only_module(tiny_llama, targets):
    model, _ = tiny_llama
    adapter = LookaheadAdapter.create(model, num_tokens=3, target_modules=targets)
    assert not isinstance(adapter.model, PeftModel)
    assert list(adapter.trainable_parameters()) == ["embeddings"]
    ids = random_prompt(model)
    pred = adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1])
    pred.sum().backward()
    assert adapter.embeddings.grad is not None


def test_lora_on_chosen_modules_only(tiny_llama):
    model, _ = tiny_llama
    adapter = LookaheadAdapter.create(model, num_tokens=2, target_modules=["q_proj", "v_proj"])
    names = [n for n in adapter.trainable_parameters() if n != "embeddings"]
    assert len(names) == (model.config.num_hidden_layers * 2 - 1) * 2  # no v_proj in the last layer
    assert all(".q_proj." in n or ".v_proj." in n for n in names)


def eager_lookahead_reference(model, ids: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """``(layers, kv_heads, S)`` from one eager forward of [prompt; lookahead embeddings] (identity LoRA)."""
    prompt_len, kv_heads = ids.shape[1], model.config.num_key_value_heads
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            embeds = torch.cat([model.get_input_embeddings()(ids), embeddings[None]], dim=1)
            attentions = model(inputs_embeds=embeds, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(impl)
    rows = []
    for att in attentions:
        heads = att.shape[1]
        block = att[0, :, prompt_len:, :prompt_len].reshape(kv_heads, heads // kv_heads, -1, prompt_len)
        mass = block.mean(dim=(1, 2))
        rows.append(mass / mass.sum(-1, keepdim=True))
    return torch.stack(rows)


@pytest.mark.parametrize("init", ["vocab_mean", "random_tokens", "normal"])
def test_predict_matches_full_eager_forward(tiny_model, init):
    model, _ = tiny_model
    ids = random_prompt(model, length=30)
    adapter = LookaheadAdapter.create(model, num_tokens=5, init=init)
    with torch.no_grad():
        pred = adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1])[0]
    want = eager_lookahead_reference(model, ids, adapter.embeddings.detach())
    torch.testing.assert_close(pred, want, atol=1e-5, rtol=0)


def test_save_load_reproduces_predictions(tiny_model, make_tiny_model, tmp_path):
    model, _ = tiny_model
    family = "qwen" if model.config.model_type == "qwen3" else "llama"
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=4, init="random_tokens")
    perturb_lora(adapter)
    with torch.no_grad():
        adapter.embeddings.add_(0.1)
        want = adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1])
    adapter.save(tmp_path)
    assert {"adapter_config.json", "adapter_model.safetensors", CONFIG_FILE} <= {
        p.name for p in tmp_path.iterdir()
    }
    fresh, _ = make_tiny_model(family)
    loaded = LookaheadAdapter.load(tmp_path, fresh)
    assert not any(p.requires_grad for p in loaded.parameters())
    with torch.no_grad():
        got = loaded.predict(prefill(loaded.model, ids)[0], ids.shape[1])
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_load_refuses_another_model_shape(tiny_llama, make_tiny_model, tmp_path):
    model, _ = tiny_llama
    LookaheadAdapter.create(model, num_tokens=2).save(tmp_path)
    wider, _ = make_tiny_model("llama", hidden_size=96)
    with pytest.raises(ValueError, match="hidden size 64"):
        LookaheadAdapter.load(tmp_path, wider)
    with pytest.raises(FileNotFoundError, match="lkv export"):
        LookaheadAdapter.load(tmp_path / "missing", model)


def test_predict_checks_cache_length(tiny_llama):
    model, _ = tiny_llama
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=2)
    cache, _ = prefill(adapter.model, ids)
    with pytest.raises(ValueError, match="expected the prompt's 23"):
        adapter.predict(cache, ids.shape[1] - 1)


def test_train_mode_reaches_only_the_adapter_dropout(tiny_llama):
    model, _ = tiny_llama
    adapter = LookaheadAdapter.create(model, num_tokens=2, lora_dropout=0.1)
    training = {type(m).__name__ for m in adapter.model.modules() if m.training}
    assert training == {"Dropout", "ModuleDict"}  # peft's lora_dropout dicts; the LLM stays in eval mode
    adapter.eval()
    assert not any(m.training for m in adapter.modules())


@pytest.mark.parametrize("init", INITS)
def test_every_init_builds_on_meta(make_tiny_model, init):
    """Lightning runs configure_model under a default-device context; ``meta`` (deferred init) is the strictest."""
    with torch.device("meta"):
        model, _ = make_tiny_model("llama")
        adapter = LookaheadAdapter.create(model, num_tokens=5, init=init)
    assert adapter.embeddings.device.type == "meta"
    assert adapter.embeddings.shape == (5, model.config.hidden_size)
    assert {p.device.type for p in adapter.trainable_parameters().values()} == {"meta"}


@pytest.mark.parametrize("init", INITS)
def test_init_ignores_the_default_device_context(tiny_llama, init):
    """A model already on its device (cuda:k in Lightning; the CPU here) under another default device gets
    the same seeded draw, on the model's device: a CPU generator must never meet a foreign default device."""
    model, _ = tiny_llama
    want = init_embeddings(model, 5, init, seed=3)
    with torch.device("meta"):
        got = init_embeddings(model, 5, init, seed=3)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=0, atol=0)


SIBLING_TARGETS = ["none", ["q_proj", "v_proj"], "all-linear"]


@pytest.mark.parametrize("main_targets", ["none", "all-linear"])
def test_named_adapters_on_one_model_each_predict_as_their_own_module(
    make_tiny_model, main_targets, tmp_path
):
    # modules sharing one frozen model (named peft adapters) == the same settings each on a model of its own
    model, _ = make_tiny_model("llama")
    ids = random_prompt(model, length=30)
    main = LookaheadAdapter.create(model, num_tokens=4, target_modules=main_targets, seed=0)
    host, siblings = main.model, []
    for index, targets in enumerate(SIBLING_TARGETS):
        sibling = LookaheadAdapter.create(
            host, num_tokens=3 + index, target_modules=targets, seed=index, adapter_name=f"s{index}"
        )
        host = sibling.model
        siblings.append(sibling)
    alone = [
        LookaheadAdapter.create(make_tiny_model("llama")[0], num_tokens=3 + i, target_modules=t, seed=i)
        for i, t in enumerate(SIBLING_TARGETS)
    ]
    for sibling, own in zip(siblings, alone, strict=True):
        assert sibling.trainable_parameters().keys() != set() and all(
            p.requires_grad for p in sibling.trainable_parameters().values()
        )
        torch.testing.assert_close(
            {
                k.replace(f".{sibling.adapter_name}.", "."): v
                for k, v in sibling.trainable_parameters().items()
            },
            {k.replace(".default.", "."): v for k, v in own.trainable_parameters().items()},
            atol=0,
            rtol=0,
        )
        perturb_lora(sibling)
        perturb_lora(own)
    # one prompt cache for all of them; each step with grad and backward, main first (as in training)
    cache, _ = prefill(main.model, ids)
    want_cache = cache_tensors(cache)
    for module in [main, *siblings]:
        importance_kl(torch.full((3, 2, 30), 1 / 30), module.predict(cache, 30)[0]).mean().backward()
    assert all(torch.equal(a, b) for a, b in zip(want_cache, cache_tensors(cache), strict=True))
    for sibling, own in zip(siblings, alone, strict=True):
        with torch.no_grad():
            got = sibling.predict(cache, 30)
            want = own.predict(prefill(own.model, ids)[0], 30)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        # the trainable flags of every module survive the others' adapter switches
        assert all(p.requires_grad for p in sibling.trainable_parameters().values())
        # a sibling's folder holds only its own LoRA, under peft's default name, and loads like any other
        sibling.save(tmp_path / sibling.adapter_name)
        loaded = LookaheadAdapter.load(tmp_path / sibling.adapter_name, make_tiny_model("llama")[0])
        with torch.no_grad():
            again = loaded.predict(prefill(loaded.model, ids)[0], 30)
        torch.testing.assert_close(again, want, atol=1e-6, rtol=0)
    assert all(p.requires_grad for p in main.trainable_parameters().values())


def test_a_second_lookahead_step_with_grad_on_the_same_cache_backpropagates_alone(tiny_llama):
    # the cache a step with grad crops back must not keep that step's graph (a sibling module's step follows)
    model, _ = tiny_llama
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=4)
    cache, _ = prefill(adapter.model, ids)
    target = torch.full((3, 2, ids.shape[1]), 1 / ids.shape[1])
    for _ in range(2):
        importance_kl(target, adapter.predict(cache, ids.shape[1])[0]).mean().backward()
    assert all(not layer.keys.requires_grad for layer in cache.layers)


@pytest.mark.parametrize("offset", [0, 37])
def test_position_offset_moves_only_the_lookahead_queries_rope(tiny_model, offset):
    """RoPE depends on query–key distance only: the lookahead tokens ``x`` positions past a prompt prefilled at
    ``0..S-1`` score exactly as ``o + x`` positions past the same prompt prefilled at ``o..o+S-1``."""
    model, _ = tiny_model
    ids = random_prompt(model)
    length = ids.shape[1]
    adapter = LookaheadAdapter.create(model, num_tokens=4)
    perturb_lora(adapter)
    shift = 100
    with torch.no_grad():
        plain = adapter.predict(prefill(adapter.model, ids)[0], length, position_offset=offset)
        shifted_cache, _ = prefill(adapter.model, ids, position_ids=torch.arange(shift, shift + length)[None])
        shifted = adapter.predict(shifted_cache, length, position_offset=shift + offset)
        unshifted = adapter.predict(prefill(adapter.model, ids)[0], length, position_offset=shift + offset)
    torch.testing.assert_close(shifted, plain, atol=2e-5, rtol=1e-4)
    # the offset really reaches RoPE: the same offset on the unshifted prompt changes the scores
    assert (unshifted - plain).abs().max() > 1e-4
    assert shifted_cache.get_seq_length() == length  # cropped back as without an offset


def test_position_offset_must_not_be_negative(tiny_llama):
    model, _ = tiny_llama
    ids = random_prompt(model)
    adapter = LookaheadAdapter.create(model, num_tokens=2)
    with pytest.raises(ValueError, match="position_offset"):
        adapter.predict(prefill(adapter.model, ids)[0], ids.shape[1], position_offset=-1)
