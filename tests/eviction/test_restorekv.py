"""RestoreKV on tiny models: KVzip's eviction of the context, the restore tokens' K/V appended, budget matched.

The exact reference: with a zero LoRA and restore embeddings that are rows of the embedding table, the restore
tokens are ordinary tokens ``r`` appended to the prompt. Decoding from RestoreKV's cache must then equal a
full-cache forward over ``[prompt; r; answer]`` in which the queries after ``r`` do not see the prompt keys
KVzip evicted (``r`` itself sees the whole prompt, as the restore pass does).
"""

import pytest
import torch

from lkv.core.generation import Sampling, prefill
from lkv.eval.results import RESULTS_FILE, ResultsFile
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import KVzipPress
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.presses.restorekv import RestoreKVPress, check_restore_folder
from lkv.eviction.registry import make_method, press_arg_names
from lkv.eviction.selector import Selection
from lkv.model.lookahead import LookaheadAdapter
from lkv.model.restore import RestoreAdapter
from tests.conftest import build_tiny_model, tiny_needle_task
from tests.eviction.conftest import prompt
from tests.reference import evicted_reference_logits, greedy_steps, keep_mask, naive_select

PROMPT_LEN = 40
N = 4
BUDGET = 12
CHUNK = 16


def token_restore(model, tokens: torch.Tensor) -> RestoreAdapter:
    """A restore module whose embeddings are the embedding rows of ``tokens`` and whose LoRA is zero."""
    adapter = RestoreAdapter.create(model, num_tokens=len(tokens), lora_rank=2, seed=0)
    adapter.embeddings.data.copy_(model.get_input_embeddings().weight[tokens].float())
    return adapter


def randomise_lora(adapter: RestoreAdapter, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for name, param in adapter.trainable_parameters().items():
        if "lora_B" in name:
            param.data.copy_(0.5 * torch.randn(param.shape, generator=generator))


def kvzip_scores(model, tokenizer, ids: torch.Tensor) -> torch.Tensor:
    return Compressor(model, tokenizer, make_method("kvzip", chunk_size=CHUNK)).score(ids).scores


def restore_press(model, restore_ids: torch.Tensor, evictor: str) -> RestoreKVPress:
    """RestoreKV with token restore tokens over KVzip, or over a lookahead module (non-zero LoRA) on the same
    model, the restore module's LoRA beside the lookahead module's."""
    if evictor == "kvzip":
        return RestoreKVPress(token_restore(model, restore_ids), KVzipPress(CHUNK))
    lookahead = LookaheadAdapter.create(model, num_tokens=4, lora_rank=2, seed=0)
    randomise_lora(lookahead)
    adapter = RestoreAdapter.create(
        lookahead.model, num_tokens=N, lora_rank=2, seed=0, adapter_name="restorekv"
    )
    adapter.embeddings.data.copy_(model.get_input_embeddings().weight[restore_ids].float())
    return RestoreKVPress(adapter, LookaheadKVPress(lookahead, kernel=1))


@pytest.mark.parametrize(
    ("evictor", "head_budget"), [("kvzip", "equal"), ("kvzip", "adaptive"), ("lookaheadkv", "equal")]
)
def test_restorekv_decodes_as_the_masked_full_sequence(tiny_model, evictor, head_budget):
    model, tokenizer = tiny_model
    ids = prompt(model, PROMPT_LEN)
    restore_ids = torch.tensor([11, 12, 13, 14])
    press = restore_press(model, restore_ids, evictor)
    selection = Selection(head_budget=head_budget)
    compressor = Compressor(model, tokenizer, press, budget=BUDGET, selection=selection)
    compressed = compressor.compress(ids)
    layers, kv_heads = model.config.num_hidden_layers, model.config.num_key_value_heads

    # the evictor's scores; C − n context entries per head (per layer under `adaptive`), then the n restore slots
    if evictor == "kvzip":
        assert torch.equal(compressed.scores, kvzip_scores(model, tokenizer, ids))
    else:
        cache, _ = prefill(model, ids)
        want = press.evictor.adapter.predict(cache, PROMPT_LEN)
        torch.testing.assert_close(compressed.scores, want, atol=0, rtol=0)
    assert compressed.prompt_len == PROMPT_LEN + N and compressed.kept_per_layer == [BUDGET] * layers
    restored = list(range(PROMPT_LEN, PROMPT_LEN + N))
    for layer, kept in enumerate(compressed.kept):
        assert compressed.cache.layers[layer].keys.shape[2] == kept.shape[-1]
        assert all(row[-N:] == restored for row in kept[0].tolist())
        assert int((kept[0, :, :-N] >= 0).sum()) == (BUDGET - N) * kv_heads
        if head_budget == "equal":
            for head, row in enumerate(compressed.scores[0, layer].tolist()):
                assert kept[0, head].tolist() == naive_select(row, BUDGET - N, 0, 0, kernel=1) + restored

    keep = keep_mask(compressed.kept, PROMPT_LEN + N)  # the restore tokens are kept, in every head
    tokens, got = greedy_steps(model, compressed.cache, compressed.next_logits, PROMPT_LEN + N, steps=4)
    want = evicted_reference_logits(model, torch.cat([ids[0], restore_ids, tokens])[None], keep)
    torch.testing.assert_close(got[1:], want[PROMPT_LEN + N : PROMPT_LEN + N + 4], atol=1e-5, rtol=0)

    # question-agnostic: the question follows the restore tokens
    question = torch.tensor([5, 6, 7, 8])
    answer = compressor.answer(compressor.compress(ids), question, Sampling(max_new_tokens=4))
    sequence = torch.cat([ids[0], restore_ids, question, torch.tensor(answer.token_ids[:-1])])[None]
    reference = evicted_reference_logits(model, sequence, keep)[PROMPT_LEN + N + len(question) - 1 :]
    assert answer.token_ids == reference.argmax(dim=-1).tolist()[: len(answer.token_ids)]


def test_the_lora_acts_in_the_restore_pass_only(tiny_llama):
    model, tokenizer = tiny_llama
    ids = prompt(model, PROMPT_LEN)
    restore_ids = torch.tensor([11, 12, 13, 14])
    adapter = token_restore(model, restore_ids)
    cache, logits = prefill(model, ids)
    plain = adapter.restore(cache, PROMPT_LEN)
    assert cache.get_seq_length() == PROMPT_LEN
    randomise_lora(adapter)
    lora = adapter.restore(cache, PROMPT_LEN)
    assert all(not torch.allclose(a, b) for a, b in zip(plain.keys[1:], lora.keys[1:], strict=True))
    # outside the pass the model is the base model: the same prefill, the same context entries
    again, again_logits = prefill(model, ids)
    torch.testing.assert_close(again_logits, logits, atol=0, rtol=0)
    compressed = Compressor(
        model, tokenizer, RestoreKVPress(adapter, KVzipPress(CHUNK)), budget=BUDGET
    ).compress(ids)
    kvzip = Compressor(model, tokenizer, make_method("kvzip", chunk_size=CHUNK), budget=BUDGET - N)
    evicted = kvzip.compress(ids)
    for layer, (mine, theirs) in enumerate(zip(compressed.cache.layers, evicted.cache.layers, strict=True)):
        torch.testing.assert_close(mine.keys[:, :, :-N], theirs.keys, atol=0, rtol=0)
        torch.testing.assert_close(mine.keys[:, :, -N:], lora.keys[layer], atol=1e-6, rtol=0)
        torch.testing.assert_close(mine.values[:, :, -N:], lora.values[layer], atol=1e-6, rtol=0)


def test_a_restore_module_only_restores(make_tiny_model):
    """A restore module appends its tokens' K/V (:meth:`RestoreAdapter.restore`); it scores no prompt
    positions, so it has no lookahead step. Its LoRA reaches the last layer's keys and values, a lookahead
    module's that layer's queries and keys."""
    assert not issubclass(RestoreAdapter, LookaheadAdapter)
    assert not any(hasattr(RestoreAdapter, name) for name in ("predict", "stream"))
    model, _ = make_tiny_model("llama")
    last = model.config.num_hidden_layers - 1
    for adapter_class, read in (
        (RestoreAdapter, {"k_proj", "v_proj"}),
        (LookaheadAdapter, {"q_proj", "k_proj"}),
    ):
        adapter = adapter_class.create(make_tiny_model("llama")[0], num_tokens=N, lora_rank=2)
        names = {name.split(".")[-4] for name in adapter.trainable_parameters() if f"layers.{last}." in name}
        assert names == read, adapter_class


def test_a_budget_that_holds_the_prompt_neither_evicts_nor_restores(tiny_llama):
    model, tokenizer = tiny_llama
    ids = prompt(model, PROMPT_LEN)
    adapter = RestoreAdapter.create(model, num_tokens=N, lora_rank=2, seed=0)
    randomise_lora(adapter)
    want = model.generate(ids, max_new_tokens=6, do_sample=False)[0, PROMPT_LEN:].tolist()
    compressor = Compressor(model, tokenizer, RestoreKVPress(adapter, KVzipPress(CHUNK)), budget=PROMPT_LEN)
    assert compressor.generate(ids, Sampling(max_new_tokens=6)).token_ids == want
    compressed = compressor.compress(ids)
    assert compressed.kept is None and compressed.prompt_len == PROMPT_LEN
    with pytest.raises(ValueError, match="no room for the context beside its 4 restore tokens"):
        Compressor(model, tokenizer, RestoreKVPress(adapter, KVzipPress(CHUNK)), budget=N).compress(ids)


def test_a_restore_folder_loads_as_saved_and_is_checked_before_any_model(
    tiny_llama, make_tiny_model, tmp_path
):
    model, tokenizer = tiny_llama
    ids = prompt(model, PROMPT_LEN)
    adapter = RestoreAdapter.create(model, num_tokens=N, lora_rank=2, seed=0)
    randomise_lora(adapter)
    adapter.save(tmp_path / "restore")
    # the files kvpress's RestoreKVPress reads: peft's, and the embeddings under its own key
    names = {path.name for path in (tmp_path / "restore").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "restore_embeddings.safetensors"} <= names
    check_restore_folder("restorekv", {"folder": str(tmp_path / "restore")})
    assert press_arg_names("restorekv") == ("folder", "chunk_size", "overlap", "scores")

    fresh, _ = make_tiny_model("llama")
    loaded = make_method("restorekv", folder=tmp_path / "restore", model=fresh, chunk_size=CHUNK)
    cache, _ = prefill(fresh, ids)
    got = loaded.adapter.restore(cache, PROMPT_LEN)
    cache, _ = prefill(model, ids)
    want = adapter.restore(cache, PROMPT_LEN)
    for mine, theirs in zip(got.keys + got.values, want.keys + want.values, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="another model"):
        Compressor(model, tokenizer, loaded, budget=BUDGET).compress(ids)

    with pytest.raises(ValueError, match="give the trained restore folder"):
        check_restore_folder("restorekv", {})
    (tmp_path / "restore" / "restore_embeddings.safetensors").unlink()
    with pytest.raises(ValueError, match="restore_embeddings.safetensors"):
        check_restore_folder("restorekv", {"folder": str(tmp_path / "restore")})


@pytest.mark.parametrize("scores", ["kvzip", "lookaheadkv"])
def test_lkv_eval_runs_restorekv_from_its_press_args(tiny_corpus, tmp_path, scores):
    import lkv.commands.eval

    model, tokenizer = build_tiny_model("llama", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    adapter = RestoreAdapter.create(model, num_tokens=N, lora_rank=2, seed=0)
    randomise_lora(adapter)
    adapter.save(tmp_path / "restore")
    lookahead = {}
    if scores == "lookaheadkv":  # the lookahead module selects, beside its own rows
        fresh, _ = build_tiny_model("llama")
        module = LookaheadAdapter.create(fresh, num_tokens=4, lora_rank=2, seed=0)
        randomise_lora(module)
        module.save(tmp_path / "adapter")
        lookahead = {"adapter": str(tmp_path / "adapter")}
    lkv.commands.eval.evaluate(
        tasks=[tiny_needle_task(tiny_corpus, lengths=(60,), max_new_tokens=2)],
        methods=("fullkv", "kvzip", "restorekv", *(["lookaheadkv"] if lookahead else [])),
        press_args={
            "restorekv": {"folder": str(tmp_path / "restore"), "chunk_size": CHUNK, "scores": scores}
        },
        budgets=(BUDGET,),
        settings=("aware", "agnostic"),
        output=str(tmp_path / "eval"),
        model=str(tmp_path / "model"),
        progress=False,
        **lookahead,
    )
    rows = {(r["method"], r["setting"]): r for r in ResultsFile(tmp_path / "eval" / RESULTS_FILE).rows}
    for setting in ("aware", "agnostic"):
        restorekv, kvzip = rows[("restorekv", setting)], rows[("kvzip", setting)]
        # budget-matched: C entries per KV head, the restore slots among them, KVzip's KV bytes
        assert restorekv["kept_tokens"] == kvzip["kept_tokens"] == BUDGET
        assert restorekv["kv_fraction"] == kvzip["kv_fraction"]
        assert restorekv["prompt_tokens"] == kvzip["prompt_tokens"] + N  # it read the restore tokens too


def test_two_restore_modules_side_by_side_answer_as_each_alone(tiny_corpus, tmp_path):
    """``variants: [restorekv:b]`` loads a second restore folder on the same model under its own peft name:
    each entry's rows equal those of a run with its folder alone."""
    import lkv.commands.eval

    model, tokenizer = build_tiny_model("llama", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for seed, name in ((0, "a"), (1, "b")):
        adapter = RestoreAdapter.create(model, num_tokens=N, lora_rank=2, seed=seed)
        randomise_lora(adapter, seed)
        adapter.embeddings.data.mul_(
            30.0
        )  # far from the vocabulary's rows: the restore tokens steer the answer
        adapter.save(tmp_path / name)

    def answers(output: str, **entries: str) -> dict[tuple[str, str], list[int]]:
        lkv.commands.eval.evaluate(
            tasks=[tiny_needle_task(tiny_corpus, lengths=(60,), max_new_tokens=6)],
            methods=("restorekv",),
            variants=tuple(m for m in entries if m != "restorekv"),
            press_args={m: {"folder": str(tmp_path / f), "chunk_size": CHUNK} for m, f in entries.items()},
            budgets=(BUDGET,),
            settings=("aware",),
            output=str(tmp_path / output),
            model=str(tmp_path / "model"),
            progress=False,
        )
        rows = ResultsFile(tmp_path / output / RESULTS_FILE).rows
        return {(r["method"], r["sample"]): r["answer_ids"] for r in rows}

    alone_a = answers("a", restorekv="a")
    alone_b = answers("b", restorekv="b")
    assert alone_a != alone_b  # the two modules answer differently: the test can tell them apart
    both = answers("both", restorekv="a", **{"restorekv:b": "b"})
    assert {k: v for k, v in both.items() if k[0] == "restorekv"} == alone_a
    assert {("restorekv", s): v for (m, s), v in both.items() if m == "restorekv:b"} == alone_b


def test_kvzip_and_restore_modules_share_one_kvzip_scoring_per_prefill(tiny_corpus, tmp_path, monkeypatch):
    """KVzip's reconstruction pass is the cost of all three methods; with ``kvzip``, ``restorekv`` and
    ``restorekv:b`` in one run it runs once per prompt and setting (their answers equal each alone: the test
    above)."""
    import lkv.commands.eval

    model, tokenizer = build_tiny_model("llama", max_position_embeddings=512)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for seed, name in ((0, "a"), (1, "b")):
        RestoreAdapter.create(model, num_tokens=N, lora_rank=2, seed=seed).save(tmp_path / name)
    calls = []
    kvzip_score = KVzipPress.score
    monkeypatch.setattr(KVzipPress, "score", lambda self, ctx: calls.append(1) or kvzip_score(self, ctx))
    lkv.commands.eval.evaluate(
        tasks=[tiny_needle_task(tiny_corpus, lengths=(60,), max_new_tokens=2)],
        methods=("fullkv", "kvzip", "restorekv"),
        variants=("restorekv:b",),
        press_args={
            "kvzip": {"chunk_size": CHUNK},
            **{
                m: {"folder": str(tmp_path / f), "chunk_size": CHUNK}
                for m, f in (("restorekv", "a"), ("restorekv:b", "b"))
            },
        },
        budgets=(BUDGET, BUDGET + 4),
        settings=("aware", "agnostic"),
        output=str(tmp_path / "eval"),
        model=str(tmp_path / "model"),
        progress=False,
    )
    rows = ResultsFile(tmp_path / "eval" / RESULTS_FILE).rows
    prefills = {(r["sample"], r["setting"]) for r in rows}
    assert {r["method"] for r in rows} == {"fullkv", "kvzip", "restorekv", "restorekv:b"}
    assert len(calls) == len(prefills) > 0
