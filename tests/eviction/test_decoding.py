"""Decode-time methods against exact equivalences and independent references.

* budget ≥ everything generated → every decode-time method (and composition) is token-identical to greedy
  ``model.generate``;
* the cache, read from its own tensors at every step, never holds more than the budget;
* H2O and Scissorhands against a slow simulation written from the papers' rules: the full sequence is re-run
  every step with per-(layer, KV head) keep-sets applied as attention masks, bookkeeping in plain Python;
* Quest with every page selected equals full attention (sdpa and eager), and with fewer pages equals a
  reference that picks the pages by looping over them.
"""

import copy

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lkv.core.attention import ImportanceCapture
from lkv.core.budget import Budget
from lkv.core.generation import Sampling, decode, greedy, prefill
from lkv.eval.trace import cache_length_traces, plot_cache_lengths
from lkv.eviction.compressor import Compressor
from lkv.eviction.decoding import (
    AttentionRows,
    DecodeStart,
    DecodeTimePress,
    H2ODecode,
    QuestAttention,
    ScissorhandsDecode,
    page_bounds,
    page_summaries,
)
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.registry import make_method
from lkv.model.lookahead import LookaheadAdapter
from tests.reference import eager_attentions

PROMPT_LEN = 40


def prompt(model, length: int = PROMPT_LEN, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)
    )


@torch.no_grad()
def run_policy(model, compressor: Compressor, ids: torch.Tensor, steps: int):
    """Decode ``steps`` tokens under ``compressor``'s policy with the low-level loop.

    Returns ``(tokens, logits (steps, vocab) before each token, entries per layer when each token is chosen)``;
    the entries are read from the cache's own tensors.
    """
    compressed = compressor.compress(ids)
    layers = compressed.cache.layers  # eviction replaces the tensors of these same layer objects
    # the policy's state for this answer, made as Compressor.decode makes it
    upkeep = compressor._begin(compressed, compressed.cache)
    cache = upkeep.enforce(compressed.cache)
    logits, lengths = [], []

    def sampler(next_logits):
        logits.append(next_logits[0].float())
        lengths.append([layer.keys.shape[2] for layer in layers])
        return greedy(next_logits)

    tokens = decode(model, cache, compressed.next_logits, ids.shape[1], steps, (), sampler, None, upkeep)
    return tokens, torch.stack(logits), lengths


POLICIES = {
    "h2o": lambda: H2ODecode(every=3),
    "scissorhands": lambda: ScissorhandsDecode(history=4, recent=3),
    "quest": lambda: QuestAttention(page_size=4, dense_layers=0),
}


def build(model, tokenizer, method: str, budget: int) -> Compressor:
    """A named decode-time method, or ``press+policy`` (a prefill press composed with a decode policy)."""
    if "+" not in method:
        args = {"quest": {"page_size": 4, "dense_layers": 0}, "scissorhands": {"history": 4}}.get(method, {})
        return Compressor(model, tokenizer, make_method(method, **args), budget=budget)
    press, policy = method.split("+")
    if press == "lookaheadkv":
        adapter = LookaheadAdapter.create(model, num_tokens=4, lora_rank=2, seed=0)
        prefill_press = LookaheadKVPress(adapter)
    else:
        prefill_press = make_method(press, **({"window": 4} if press in ("snapkv", "pyramidkv") else {}))
    return Compressor(model, tokenizer, prefill_press, budget, decode_policy=POLICIES[policy]())


# --- exact equivalences ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["h2o-decode", "scissorhands", "quest", "snapkv+h2o", "pyramidkv+scissorhands", "tova+quest"]
)
def test_budget_above_total_length_equals_plain_greedy(tiny_model, method):
    model, tokenizer = tiny_model
    ids = prompt(model)
    want = model.generate(ids, max_new_tokens=20, do_sample=False)[0, PROMPT_LEN:].tolist()
    compressor = build(model, tokenizer, method, budget=64)
    out = compressor.generate(ids, Sampling(max_new_tokens=20))
    assert out.token_ids == want
    # Before decoding, then after each of the 19 forward passes: nothing was evicted.
    assert out.cache_lengths == list(range(PROMPT_LEN, PROMPT_LEN + 20))

    # Question-agnostic: the question is appended to the compressed context (the same path as FullKV's).
    question = prompt(model, 7, seed=1)
    want = Compressor(model, tokenizer, "fullkv").generate(
        ids, Sampling(max_new_tokens=10), question=question
    )
    assert (
        compressor.generate(ids, Sampling(max_new_tokens=10), question=question).token_ids == want.token_ids
    )


@pytest.mark.parametrize(
    ("method", "every"),
    [
        ("h2o-decode", 1),
        ("scissorhands", 1),
        ("snapkv+h2o", 3),
        ("pyramidkv+scissorhands", 1),
        ("lookaheadkv+h2o", 3),
    ],
)
def test_cache_never_exceeds_the_budget_during_a_long_generation(tiny_llama, method, every):
    model, tokenizer = tiny_llama
    budget, steps = 12, 60
    compressor = build(model, tokenizer, method, budget)
    assert compressor.decode_policy.every == every
    ids = prompt(model)
    caps = compressor.layer_budgets(budget, PROMPT_LEN)
    tokens, _, lengths = run_policy(model, compressor, ids, steps)
    assert len(tokens) == steps == len(lengths)
    for step, per_layer in enumerate(lengths):
        assert all(n <= cap for n, cap in zip(per_layer, caps, strict=True)), (step, per_layer, caps)
        if step:  # after a forward pass and its eviction: every is the drop amount
            assert all(n >= cap - every + 1 for n, cap in zip(per_layer, caps, strict=True)), (
                step,
                per_layer,
            )
    # The Compressor's own loop (EOS may end it early) keeps the same bound and gives the same answer.
    out = compressor.generate(ids, Sampling(max_new_tokens=30))
    assert max(out.cache_lengths) == max(caps) and out.token_ids == tokens[: len(out.token_ids)]


def test_question_agnostic_answer_is_bounded_too(tiny_qwen):
    model, tokenizer = tiny_qwen
    compressor = Compressor(model, tokenizer, "h2o-decode", budget=10)
    out = compressor.generate(prompt(model), Sampling(max_new_tokens=30), question=prompt(model, 9, seed=2))
    # The question is appended on top of 10 kept entries, then evicted back before decoding starts.
    assert out.cache_lengths[0] == 10 and max(out.cache_lengths) == 10 and len(out.token_ids) == 30


# --- H2O and Scissorhands against a simulation of the papers' rules ----------------------------------------

SIMULATED = "lkv_test_decode_simulation"
SIM_KWARG = "lkv_test_sim"


class Simulation:
    """What the simulated attention applies and records.

    Rows before ``prompt_len`` are plain causal. A decoding row sees the keys of ``masks[row]``
    (``(layers, heads, row + 1)``), or with ``quest = (page_size, pages)`` the pages Quest's rule picks.
    ``rows[layer]`` holds the group-mean attention ``(kv_heads, Q, K)`` of the layer's last forward pass.
    """

    def __init__(self, prompt_len: int, quest: tuple[int, int] | None = None) -> None:
        self.prompt_len = prompt_len
        self.quest = quest
        self.masks: dict[int, torch.Tensor] = {}
        self.rows: dict[int, torch.Tensor] = {}

    def row_mask(self, layer: int, row: int, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        """``(heads, row + 1)`` keys row ``row`` may see (``query (heads, d)``, ``key (kv_heads, K, d)``)."""
        if row < self.prompt_len:
            return None
        if self.quest is not None:
            return quest_reference_mask(query, key[:, : row + 1], *self.quest)
        return self.masks[row][layer]


def _simulated_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """fp32 attention over the whole sequence; rows with a simulated mask see only its keys."""
    sim: Simulation = kwargs[SIM_KWARG]
    heads, kv_heads = query.shape[1], key.shape[1]
    group = heads // kv_heads
    q_len, k_len = query.shape[2], key.shape[2]
    keys = key[0].float().repeat_interleave(group, dim=0)
    logits = query[0].float() @ keys.transpose(-1, -2) * scaling  # (heads, Q, K)
    allowed = torch.ones(heads, q_len, k_len, dtype=torch.bool).tril()
    for row in range(q_len):
        mask = sim.row_mask(module.layer_idx, row, query[0, :, row].float(), key[0].float())
        if mask is not None:
            allowed[:, row, : row + 1] = mask
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    sim.rows[module.layer_idx] = probs.view(kv_heads, group, q_len, k_len).mean(1)
    out = probs @ value[0].float().repeat_interleave(group, dim=0)
    return out[None].to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(SIMULATED, _simulated_attention)
AttentionMaskInterface.register(SIMULATED, sdpa_mask)


def reference_select(positions: list[int], priority: dict[int, float], keep: int, recent: int) -> list[int]:
    """The published rule: the ``recent`` latest positions, then the highest priorities (earlier on ties)."""
    window = positions[len(positions) - recent :] if recent else []
    rest = sorted((p for p in positions if p not in window), key=lambda p: (-priority[p], p))
    return sorted(window + rest[: keep - len(window)])


@torch.no_grad()
def simulate(model, ids, rule: str, budget: int, recent: int, every: int, steps: int, history: int = 8):
    """Greedy tokens and logits of ``rule`` (``h2o``/``scissorhands``) on a full cache with masks."""
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(SIMULATED)
    sim = Simulation(ids.shape[1])
    prompt_len, layers = ids.shape[1], model.config.num_hidden_layers
    kv_heads = model.config.num_key_value_heads
    group = model.config.num_attention_heads // kv_heads
    logits = [reference(input_ids=ids, **{SIM_KWARG: sim}).logits[0, -1].float()]

    # Per layer and KV head: kept positions, and the statistic of every position seen.
    kept, stat, prompt_share, unimportant_rows = [], [], [], []
    window = min(history, prompt_len)
    for layer in range(layers):
        rows = sim.rows[layer]  # (kv_heads, S, S)
        kept.append([])
        stat.append([])
        prompt_share.append([])
        unimportant_rows.append([[] for _ in range(kv_heads)])
        for head in range(kv_heads):
            if rule == "h2o":
                priority = {p: float(rows[head, :, p].sum()) for p in range(prompt_len)}
            else:
                counts = dict.fromkeys(range(prompt_len), 0)
                for query in range(prompt_len - window, prompt_len):
                    for p in range(query + 1):
                        counts[p] += bool(rows[head, query, p] <= 1.0 / (query + 1))
                prompt_share[layer].append({p: counts[p] / window for p in counts})
                priority = {p: -float(c) for p, c in counts.items()}
            stat[layer].append(priority)
            kept[layer].append(reference_select(list(range(prompt_len)), priority, budget, recent))

    tokens = []
    for step in range(steps):
        tokens.append(int(logits[-1].argmax()))
        if step == steps - 1:
            break
        row = prompt_len + step
        masks = torch.zeros(layers, kv_heads, row + 1, dtype=torch.bool)
        for layer in range(layers):
            for head in range(kv_heads):
                masks[layer, head, kept[layer][head] + [row]] = True
        sim.masks[row] = masks.repeat_interleave(group, dim=1)
        full = torch.cat([ids, torch.tensor([tokens])], dim=1)
        logits.append(reference(input_ids=full, **{SIM_KWARG: sim}).logits[0, -1].float())
        observed = step + 1  # decoding queries seen so far
        for layer in range(layers):
            rows = sim.rows[layer][:, row]  # (kv_heads, K)
            for head in range(kv_heads):
                entries = kept[layer][head] + [row]
                if rule == "h2o":
                    stat[layer][head][row] = 0.0
                    for p in entries:
                        stat[layer][head][p] += float(rows[head, p])
                    priority = stat[layer][head]
                else:
                    unimportant_rows[layer][head].append(
                        {p for p in entries if rows[head, p] <= 1.0 / len(entries)}
                    )
                    recent_rows = unimportant_rows[layer][head][-history:]
                    share = prompt_share[layer][head]
                    priority = {
                        p: -(
                            sum(p in r for r in recent_rows) + share.get(p, 0.0) * max(history - observed, 0)
                        )
                        for p in entries
                    }
                if len(entries) > budget:
                    entries = reference_select(entries, priority, budget - every + 1, recent)
                kept[layer][head] = entries
    return tokens, torch.stack(logits)


@pytest.mark.parametrize(
    ("rule", "every"), [("h2o", 1), ("h2o", 3), ("scissorhands", 1), ("scissorhands", 2)]
)
def test_policies_match_a_simulation_of_the_published_rules(tiny_llama, rule, every):
    model, tokenizer = tiny_llama
    ids = prompt(model)
    budget, recent, steps = 10, 4, 24
    args = {"every": every, "recent": recent, **({"history": 8} if rule == "scissorhands" else {})}
    method = make_method("h2o-decode" if rule == "h2o" else "scissorhands", **args)
    compressor = Compressor(model, tokenizer, method, budget=budget)
    tokens, logits, lengths = run_policy(model, compressor, ids, steps)
    want_tokens, want_logits = simulate(model, ids, rule, budget, recent, every, steps)
    assert tokens == want_tokens
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=0)
    assert max(max(per_layer) for per_layer in lengths) == budget
    assert compressor.generate(ids, Sampling(max_new_tokens=steps)).token_ids == want_tokens


# --- Quest --------------------------------------------------------------------------------------------------


def quest_reference_mask(query: torch.Tensor, key: torch.Tensor, page_size: int, pages: int) -> torch.Tensor:
    """``(heads, K)``: per query head, the ``pages`` pages with the largest bound, the last page included."""
    heads, kv_heads, k_len = query.shape[0], key.shape[0], key.shape[1]
    group = heads // kv_heads
    starts = list(range(0, k_len, page_size))
    mask = torch.zeros(heads, k_len, dtype=torch.bool)
    for head in range(heads):
        bounds = []
        for start in starts:
            block = key[head // group, start : start + page_size]
            low, high = block.min(dim=0).values, block.max(dim=0).values
            bounds.append(float(torch.maximum(query[head] * low, query[head] * high).sum()))
        others = sorted(range(len(starts) - 1), key=lambda p: -bounds[p])[: pages - 1]
        for page in [*others, len(starts) - 1]:
            mask[head, starts[page] : starts[page] + page_size] = True
    return mask


@torch.no_grad()
def quest_reference(model, ids, tokens: list[int], page_size: int, pages: int) -> torch.Tensor:
    """Logits before each of ``tokens``: dense prefill, then every decoding row limited to Quest's pages."""
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(SIMULATED)
    sim = Simulation(ids.shape[1], quest=(page_size, pages))
    full = torch.cat([ids, torch.tensor([tokens[:-1]])], dim=1)
    # One pass over the whole sequence: row S - 1 + t predicts token t.
    return reference(input_ids=full, **{SIM_KWARG: sim}).logits[0, ids.shape[1] - 1 :].float()


@torch.no_grad()
def plain_logits(model, ids: torch.Tensor, steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and logits before each, full cache, no policy."""
    cache, next_logits = prefill(model, ids)
    logits = []

    def sampler(step_logits):
        logits.append(step_logits[0].float())
        return greedy(step_logits)

    return decode(model, cache, next_logits, ids.shape[1], steps, (), sampler), torch.stack(logits)


@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_quest_with_every_page_selected_equals_full_attention(make_tiny_model, base):
    model, tokenizer = make_tiny_model("llama", attn_implementation=base)
    ids = prompt(model)
    quest = Compressor(model, tokenizer, make_method("quest", page_size=4, dense_layers=0), budget=64)
    tokens, logits, lengths = run_policy(model, quest, ids, 20)
    want_tokens, want_logits = plain_logits(model, ids, 20)
    assert tokens == want_tokens
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=0)
    assert lengths[-1] == [PROMPT_LEN + 19] * 3  # nothing evicted: the full cache stays in memory


@pytest.mark.parametrize(("page_size", "budget"), [(4, 8), (4, 13), (5, 20)])
def test_quest_attends_to_the_pages_a_reference_picks(tiny_model, page_size, budget):
    model, tokenizer = tiny_model
    ids = prompt(model)
    quest = Compressor(
        model, tokenizer, make_method("quest", page_size=page_size, dense_layers=0), budget=budget
    )
    tokens, logits, _ = run_policy(model, quest, ids, 12)
    torch.testing.assert_close(
        logits, quest_reference(model, ids, tokens, page_size, budget // page_size), atol=1e-4, rtol=0
    )
    _, full_logits = plain_logits(model, ids, 12)
    assert not torch.allclose(logits[1:], full_logits[1:], atol=1e-3)  # the selection does matter
    out = quest.generate(ids, Sampling(max_new_tokens=12))
    assert out.token_ids == tokens[: len(out.token_ids)] and out.kv_bytes_kept == out.kv_bytes_full


def test_page_bounds_bound_every_logit_of_their_page():
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 4, 8, generator=generator), torch.randn(1, 2, 23, 8, generator=generator)
    bound = page_bounds(query, *page_summaries(key, page_size=5))
    logits = torch.einsum("bkgd,bknd->bkgn", query.view(1, 2, 2, 8), key).reshape(1, 4, 23)
    assert bound.shape == (1, 4, 5)
    for page in range(5):
        assert (bound[..., page] >= logits[..., page * 5 : page * 5 + 5].amax(-1) - 1e-5).all()
    torch.testing.assert_close(page_bounds(query, *page_summaries(key, page_size=1)), logits)


def test_quest_page_summaries_grow_with_the_cache(tiny_llama):
    model, tokenizer = tiny_llama
    upkeep = QuestAttention(budget=8, page_size=4).begin(
        model, prefill(model, prompt(model, 9))[0], DecodeStart(9)
    )
    key = torch.randn(1, 2, 30, 16)
    for length in (9, 10, 12, 13, 30):  # partial, partial, full, partial, skipping several pages
        for got, want in zip(
            upkeep.summaries(0, key[:, :, :length]), page_summaries(key[:, :, :length], 4), strict=True
        ):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_quest_leaves_the_first_layers_dense_and_fails_loudly_without_its_wrapper(tiny_llama):
    model, tokenizer = tiny_llama
    compressor = Compressor(model, tokenizer, "quest", budget=16)  # one page of 16; layers 0 and 1 dense
    compressed = compressor.compress(prompt(model))
    upkeep = compressor.decode_policy.begin(
        model, compressed.cache, DecodeStart(PROMPT_LEN, budget=Budget(16))
    )
    query, key = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 41, 16)
    assert upkeep.allowed_keys(1, query, key) is None
    allowed = upkeep.allowed_keys(2, query, key)
    assert (
        allowed.shape == (1, 4, 1, 41) and allowed.sum(-1).flatten().tolist() == [9] * 4
    )  # the current page
    model.set_attn_implementation(
        "lkv_sdpa"
    )  # the attention was reset behind Quest's back: fail, not go dense
    with pytest.raises(RuntimeError, match="quest was not applied"):
        decode(model, compressed.cache, compressed.next_logits, PROMPT_LEN, 3, upkeep=upkeep)


# --- plumbing ----------------------------------------------------------------------------------------------


def test_attention_rows_are_the_eager_rows_and_keep_the_capture_meaning(tiny_qwen):
    model, _ = tiny_qwen
    ids = prompt(model, 24)
    rows, plain = AttentionRows(num_keys=24, last_queries=5), ImportanceCapture(num_keys=24, last_queries=5)
    prefill(model, ids, lkv_capture=[rows, plain])
    torch.testing.assert_close(rows.scores(2), plain.scores(2), atol=1e-6, rtol=0)
    for layer, att in enumerate(eager_attentions(model, ids)):
        want = att[0, :, 19:].reshape(2, 2, 5, 24).mean(1)
        torch.testing.assert_close(rows.rows(layer)[0], want, atol=1e-6, rtol=0)


def test_methods_are_presses_and_bad_settings_fail_clearly(tiny_llama):
    model, tokenizer = tiny_llama
    method = make_method("h2o-decode", every=2)
    assert isinstance(method, DecodeTimePress) and method.decode_policy.every == 2
    assert make_method("snapkv", window=4).window == 4
    with pytest.raises(ValueError, match="h2o-decode.*quest"):
        make_method("nope")
    with pytest.raises(ValueError, match="brings its own decode policy"):
        Compressor(model, tokenizer, "scissorhands", decode_policy=H2ODecode())
    with pytest.raises(ValueError, match="recent window"):
        Compressor(model, tokenizer, make_method("h2o-decode", every=8, recent=6), budget=12).generate(
            prompt(model), Sampling(max_new_tokens=4)
        )
    with pytest.raises(ValueError, match="fraction"):
        H2ODecode(recent=1.5)
    with pytest.raises(ValueError, match="every"):
        ScissorhandsDecode(every=0)
    with pytest.raises(ValueError, match="no budget"):
        H2ODecode().caps(DecodeStart(PROMPT_LEN), 3)


# --- the embedded model ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_decode_time_methods_on_the_embedded_model():
    from lkv.model.backbone import load_backbone

    model, tokenizer = load_backbone("smollm2-135m")
    text = (
        "Notes from the harbour office. The ferry leaves at seven and returns at noon. "
        "The special magic number for Oslo is 4417. Boats are counted every evening. "
        * 12
        + "\n\nWhat is the special magic number for Oslo?"
    )
    want = Compressor(model, tokenizer, "fullkv").generate(text, Sampling(max_new_tokens=16)).token_ids
    for method in ("h2o-decode", "scissorhands", "quest"):
        out = Compressor(model, tokenizer, method, budget=2048).generate(text, Sampling(max_new_tokens=16))
        assert out.token_ids == want, method
    bounded = Compressor(model, tokenizer, "h2o-decode", budget=64)
    bounded.eos_token_ids = []
    out = bounded.generate(text, Sampling(max_new_tokens=48))
    assert len(out.token_ids) == 48 and out.cache_lengths[0] == 64 and max(out.cache_lengths) == 64


def test_cache_length_traces_run_past_eos_and_plot(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    ids = prompt(model)
    budget, steps = 12, 20
    compressors = {m: build(model, tokenizer, m, budget) for m in ("fullkv", "h2o-decode")}
    compressors["snapkv"] = Compressor(model, tokenizer, make_method("snapkv", window=4), budget=budget)
    for compressor in compressors.values():  # every token would end the answer, if EOS were honoured
        compressor.eos_token_ids = list(range(model.config.vocab_size))
    traces = cache_length_traces(compressors, ids, steps)
    assert traces["fullkv"] == list(range(PROMPT_LEN, PROMPT_LEN + steps))
    assert traces["snapkv"] == list(range(budget, budget + steps))  # prefill-only: grows by one per token
    assert len(traces["h2o-decode"]) == steps and max(traces["h2o-decode"]) <= budget
    assert compressors["fullkv"].eos_token_ids  # the callers' compressors are left as they were
    path = plot_cache_lengths(traces, budget, tmp_path / "plots" / "trace.png", "tiny")
    assert path.stat().st_size > 0
