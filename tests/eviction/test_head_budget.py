"""AdaKV head-adaptive budgets: the selection against a naive reference, the masked physical cache against
the full cache with the evicted keys masked, streamed ≡ two-phase, batched ≡ batch 1."""

import pytest
import torch

from lkv.core.attention import install_capture
from lkv.core.batched_generation import greedy_batch, stack_caches
from lkv.core.cache import KEY_MASK_ATTR, gather_cache, select_rows
from lkv.core.generation import Sampling, prefill
from lkv.eval.batched_decode import AnswerBatches, answer_request
from lkv.eviction.compressor import Compressor
from lkv.eviction.decoding import H2ODecode
from lkv.eviction.presses import LookaheadKVPress
from lkv.eviction.selector import Selection, adaptive_width, safeguarded, select_indices
from tests.conftest import FAMILIES, build_tiny_model
from tests.eviction.conftest import PROMPT_LEN, build_press, prompt
from tests.reference import check_decodes_as_masked, evicted_reference_logits, greedy_steps, keep_mask

BUDGET = 12
ADAPTIVE = Selection(head_budget="adaptive")
THRESHOLD = Selection(head_budget="threshold", threshold=0.0)
METHODS = ["snapkv", "h2o", "expected_attention", "keydiff", "kvzip", "lookaheadkv"]
STREAMED = ["snapkv", "h2o", "expected_attention", "keydiff", "lookaheadkv"]


def naive_adaptive(
    scores: list[list[float]], budget: int, safeguard: float, sink: int, recent: int
) -> list[list[int]]:
    """One layer, head by head in plain Python: each head's protected positions and its top ⌊safeguard·C⌋ are
    kept, the rest of ``C · heads`` goes to the best remaining (score, then earlier head, then earlier position)."""
    heads, length = len(scores), len(scores[0])
    guaranteed = max(1, int(budget * safeguard)) if safeguard > 0 else 0
    kept = [set() for _ in range(heads)]
    for h, row in enumerate(scores):
        always = {j for j in range(length) if row[j] == float("inf") or j < sink or j >= length - recent}
        ranked = sorted(range(length), key=lambda j: (j not in always, -row[j], j))
        kept[h] |= always | set(ranked[:guaranteed])
    rest = sorted(
        ((h, j) for h in range(heads) for j in range(length) if j not in kept[h]),
        key=lambda hj: (-scores[hj[0]][hj[1]], hj[0], hj[1]),
    )
    for h, j in rest[: budget * heads - sum(len(k) for k in kept)]:
        kept[h].add(j)
    return [sorted(k) for k in kept]


def valid_rows(index: torch.Tensor) -> list[list[int]]:
    """Per head the kept positions of a ``(1, kv_heads, W)`` index, padding (``-1``) dropped."""
    return [[p for p in row if p >= 0] for row in index[0].tolist()]


@pytest.mark.parametrize("safeguard", [0.2, 0.0, 1.0])
def test_adaptive_selection_matches_naive_reference(safeguard):
    generator = torch.Generator().manual_seed(0)
    # peaked and flat heads, a +inf window, ties on a coarse grid
    scores = torch.rand(1, 3, 4, 40, generator=generator).mul(8).round()
    scores[:, :, 0] = scores[:, :, 0] ** 3
    scores[:, 1, :, -3:] = float("inf")
    for budget, sink, recent in [(8, 0, 0), (10, 2, 1), (39, 0, 0)]:
        kept = select_indices(
            scores, [budget] * 3, Selection(sink, recent, head_budget="adaptive", safeguard=safeguard)
        )
        for layer in range(3):
            rows = valid_rows(kept[layer])
            want = naive_adaptive(scores[0, layer].tolist(), budget, safeguard, sink, recent)
            assert rows == want, f"layer {layer}, C={budget}"
            assert sum(map(len, rows)) == budget * 4
            assert min(map(len, rows)) >= safeguarded(budget, safeguard)
            assert kept[layer].shape[-1] == max(map(len, rows))  # gathered to the widest head
    # a fixed width (kvpress's uniform layers) pads every row further
    width = adaptive_width(8, 4, 40, safeguard)
    padded = select_indices(scores, [8] * 3, Selection(head_budget="adaptive", safeguard=safeguard), width)
    assert all(index.shape[-1] == width for index in padded)
    assert [valid_rows(i) for i in padded] == [
        valid_rows(i)
        for i in select_indices(scores, [8] * 3, Selection(head_budget="adaptive", safeguard=safeguard))
    ]


def test_equal_heads_keep_the_equal_selection_when_scores_agree():
    scores = torch.rand(1, 2, 3, 30, generator=torch.Generator().manual_seed(1))
    # every head ranks alike and a safeguard of 1 guarantees each its own top C: adaptive = equal
    equal = select_indices(scores, [7, 7])
    adaptive = select_indices(scores, [7, 7], Selection(head_budget="adaptive", safeguard=1.0))
    assert all(torch.equal(a, b) for a, b in zip(equal, adaptive, strict=True))


@pytest.fixture(params=[(f, a) for f in FAMILIES for a in ("sdpa", "eager")], ids=lambda p: "-".join(p))
def model_and_tokenizer(request):
    return build_tiny_model(request.param[0], attn_implementation=request.param[1])


@pytest.mark.parametrize("method", METHODS)
def test_adaptive_eviction_matches_masked_full_cache(model_and_tokenizer, method):
    model, tokenizer = model_and_tokenizer
    press = build_press(method, model)
    model = press.base_model if isinstance(press, LookaheadKVPress) else model
    ids = prompt(model)
    compressor = Compressor(model, tokenizer, press, budget=BUDGET, selection=ADAPTIVE)
    compressed = compressor.compress(ids)
    keep = keep_mask(compressed.kept, PROMPT_LEN)
    kv_heads = model.config.num_key_value_heads
    assert (keep.sum(dim=(1, 2)) == BUDGET * kv_heads).all() and compressed.kept_per_layer == [BUDGET] * len(
        keep
    )
    widths = [layer.keys.shape[2] for layer in compressed.cache.layers]
    assert widths == [int(keep[layer].sum(-1).max()) for layer in range(len(keep))]  # the widest head's count
    full_entry = compressed.kv_bytes_full // (len(widths) * PROMPT_LEN)  # bytes of one (layer, token) entry
    assert compressed.kv_bytes_kept == full_entry * sum(widths)  # what is allocated, padding included

    check_decodes_as_masked(model, compressor, compressed, ids, keep)


@pytest.mark.parametrize("selection", [ADAPTIVE, THRESHOLD], ids=["adaptive", "threshold"])
@pytest.mark.parametrize("method", STREAMED)
def test_head_budget_streamed_equals_two_phase(tiny_model, method, selection):
    """AdaKV, and a fixed threshold (KVzap's DMS, ragged across layers too)."""
    model, tokenizer = tiny_model
    press = build_press(method, model)
    model = press.base_model if isinstance(press, LookaheadKVPress) else model
    ids = prompt(model)
    for budget in (BUDGET, 0.5):
        want = Compressor(model, tokenizer, press, budget, selection=selection).compress(ids)
        got = Compressor(model, tokenizer, press, budget, selection=selection, streamed=True).compress(ids)
        for layer, (a, b) in enumerate(zip(got.kept, want.kept, strict=True)):
            assert torch.equal(a, b), f"budget {budget}, layer {layer}: other positions kept"
        for a, b in zip(got.cache.layers, want.cache.layers, strict=True):
            mask_a, mask_b = getattr(a, KEY_MASK_ATTR), getattr(b, KEY_MASK_ATTR)
            assert torch.equal(a.keys, b.keys) and (mask_a is mask_b is None or torch.equal(mask_a, mask_b))
        sampling = Sampling(max_new_tokens=6)
        for question in (None, [5, 6, 7]):
            streamed = Compressor(model, tokenizer, press, budget, selection=selection, streamed=True)
            two_phase = Compressor(model, tokenizer, press, budget, selection=selection)
            assert (
                streamed.generate(ids, sampling, question).token_ids
                == two_phase.generate(ids, sampling, question).token_ids
            )


def test_adaptive_answers_batched_equal_batch_one(tiny_model):
    """Each answer twice: equal cache layouts (ragged, masked) share a batch."""
    model, tokenizer = tiny_model
    sampling = Sampling(max_new_tokens=6)
    requests, want = [], []
    for seed in range(3):
        ids = prompt(model, PROMPT_LEN - seed, seed=seed)
        for method in ("snapkv", "keydiff"):
            compressor = Compressor(model, tokenizer, build_press(method, model), BUDGET, selection=ADAPTIVE)
            for appended in ([], [5, 6, 7]):
                single = compressor.compress(ids)
                gen = (
                    compressor.answer(single, appended, sampling)
                    if appended
                    else compressor.decode(single, sampling)
                )
                for _ in range(2):
                    want.append(gen.token_ids)
                    requests.append(answer_request(model, compressor.compress(ids), appended, sampling))
    got: dict[int, list[int]] = {}
    batches = AnswerBatches(model, tokenizer, Compressor(model, tokenizer).eos_token_ids, batch_size=8)
    for index, request in enumerate(requests):
        batches.add(request, lambda gen, index=index: got.__setitem__(index, gen.token_ids))
    batches.flush()
    assert [got[i] for i in range(len(want))] == want


def test_masked_caches_stack_with_left_padding(tiny_model):
    """Masked caches of uniform layer widths (the kvpress bridge's layout) and different widths share a
    left-padded batch: the key masks travel with their rows."""
    model, tokenizer = tiny_model
    press = build_press("snapkv", model)
    kv_heads, num_layers = model.config.num_key_value_heads, model.config.num_hidden_layers
    caches, logits, positions, want = [], [], [], []
    for seed, (length, budget) in enumerate([(PROMPT_LEN, 12), (40, 8), (44, 10)]):
        ids = prompt(model, length, seed=seed)
        scored = Compressor(model, tokenizer, press, budget).score(ids)
        kept = select_indices(
            scored.scores,
            [budget] * num_layers,
            Selection(recent=4, head_budget="adaptive"),
            width=adaptive_width(budget, kv_heads, length),
        )
        alone = gather_cache(prefill(model, ids)[0], kept)
        want.append(greedy_steps(model, alone, scored.next_logits, length, 5)[0].tolist())
        caches.append(gather_cache(scored.cache, kept))
        logits.append(scored.next_logits)
        positions.append(length)
    padded = stack_caches(caches, logits, positions)
    assert padded.padding_fraction > 0 and any(
        getattr(layer, KEY_MASK_ATTR) is not None for layer in padded.cache.layers
    )
    done = {finished.row: finished.tokens for finished in greedy_batch(model, padded, 6, keep_prompt=False)}
    assert [done[row][:5] for row in range(3)] == want


def test_select_rows_keeps_key_masks_aligned(tiny_llama):
    model, _ = tiny_llama
    cache = gather_cache(prefill(model, prompt(model))[0], [torch.tensor([[[0, 1, 2], [3, 4, -1]]])] * 3)
    stacked = stack_caches([cache, cache], [torch.zeros(1, 5)] * 2, [PROMPT_LEN] * 2).cache
    select_rows(stacked, torch.tensor([1]))
    assert [tuple(getattr(layer, KEY_MASK_ATTR).shape) for layer in stacked.layers] == [(1, 2, 3)] * 3
    assert stacked.layers[0].keys.shape[0] == 1


def test_head_budget_bad_input(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(ValueError, match="head_budget must be one of equal, adaptive"):
        Selection(head_budget="per-head")
    with pytest.raises(ValueError, match=r"safeguard must be in \[0, 1\]"):
        Selection(head_budget="adaptive", safeguard=1.5)
    with pytest.raises(ValueError, match="cannot go with the decode-time policy"):
        Compressor(model, tokenizer, "snapkv", selection=ADAPTIVE, decode_policy=H2ODecode())


def test_hooks_are_installed_once(tiny_llama):
    model, _ = tiny_llama
    decoder = model.get_decoder()
    before = len(decoder._forward_pre_hooks)
    install_capture(model)
    assert len(decoder._forward_pre_hooks) == before


@pytest.mark.slow
@pytest.mark.parametrize("method", ["expected_attention", "kvzip"])
def test_adaptive_eviction_on_the_embedded_model(method):
    """SmolLM2-135M: a 500-token chat prompt compressed to C = 64 per head with adaptive head budgets decodes
    with the logits of the full cache whose evicted keys are masked head by head."""
    from lkv.model.backbone import load_backbone

    model, tokenizer = load_backbone("smollm2-135m")
    text = "The special magic number for Oslo is 4417. The ferry leaves at seven and returns at noon. " * 22
    compressor = Compressor(model, tokenizer, method, budget=64, selection=ADAPTIVE)
    ids = compressor.encode(text + "\n\nWhat is the special magic number for Oslo?")
    compressed = compressor.compress(ids)
    keep = keep_mask(compressed.kept, ids.shape[1])
    assert (keep.sum(dim=(1, 2)) == 64 * model.config.num_key_value_heads).all()
    assert max(layer.keys.shape[2] for layer in compressed.cache.layers) > 64  # some head keeps more than C
    tokens, got = greedy_steps(model, compressed.cache, compressed.next_logits, ids.shape[1], steps=3)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep)
    torch.testing.assert_close(got, want[ids.shape[1] - 1 :], atol=1e-4, rtol=0)
