"""Slow, independent references the fast paths are tested against.

``evicted_reference_logits`` runs the whole sequence (prompt + later tokens) through a copy of the model
whose attention is computed here by hand: causal, and for every query after the prompt the prompt keys a
(layer, KV head) evicted are masked out. A compressed cache decoded with the right positions must give the
same logits, which pins down both the gathered entries and the position ids.
"""

import copy
import math

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lkv.core.compat import cache_kwargs
from lkv.core.generation import Sampling


def eager_attentions(model, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per layer ``(batch, heads, Q, K)`` softmax attention of a plain eager forward over ``ids``."""
    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(impl)


def eager_reference(model, ids: torch.Tensor, num_keys: int, first_query: int) -> torch.Tensor:
    """``(layers, kv_heads, S)`` from eager softmax rows of queries ``first_query:`` over the full sequence."""
    attentions = eager_attentions(model, ids)
    kv_heads = model.config.num_key_value_heads
    rows = []
    for att in attentions:
        batch, heads, q_len, _ = att.shape
        block = att[:, :, first_query:, :num_keys].reshape(batch, kv_heads, heads // kv_heads, -1, num_keys)
        mass = block.mean(dim=(2, 3))
        rows.append(mass / mass.sum(-1, keepdim=True))
    return torch.stack(rows, dim=1)[0]


EVICTED_ATTENTION = "lkv_test_evicted"
KEEP_KWARG = "lkv_test_keep"


def _evicted_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """fp32 attention; queries after the prompt do not see the prompt keys that ``keep`` evicts per head."""
    keep = kwargs.get(KEEP_KWARG)
    heads, kv_heads = query.shape[1], key.shape[1]
    group = heads // kv_heads
    q_len, k_len = query.shape[2], key.shape[2]
    keys = key.float().repeat_interleave(group, dim=1)
    values = value.float().repeat_interleave(group, dim=1)
    logits = query.float() @ keys.transpose(-1, -2) * scaling
    rows = torch.arange(q_len) + (k_len - q_len)  # absolute position of each query (no padding)
    allowed = (torch.arange(k_len)[None, :] <= rows[:, None]).expand(heads, q_len, k_len).clone()
    if keep is not None:
        prompt_len = keep.shape[-1]
        evicted = ~keep[module.layer_idx].repeat_interleave(group, dim=0)  # (heads, S)
        after_prompt = rows >= prompt_len
        allowed[:, :, :prompt_len] &= ~(evicted[:, None, :] & after_prompt[None, :, None])
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ values).to(query.dtype).transpose(1, 2).contiguous(), None


AttentionInterface.register(EVICTED_ATTENTION, _evicted_attention)
AttentionMaskInterface.register(EVICTED_ATTENTION, sdpa_mask)


def keep_mask(kept: list[torch.Tensor], prompt_len: int) -> torch.Tensor:
    """``(layers, kv_heads, S)`` bool from per-layer ``(1, kv_heads, C_l)`` kept positions (``-1``: padding)."""
    masks = []
    for index in kept:
        mask = torch.zeros(index.shape[1], prompt_len, dtype=torch.bool)
        for head, row in enumerate(index[0].cpu()):
            mask[head, row[row >= 0]] = True
        masks.append(mask)
    return torch.stack(masks)


@torch.no_grad()
def evicted_reference_logits(model, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Logits ``(N, vocab)`` of ``ids (1, N)`` with the full cache, evicted prompt keys masked per head."""
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(EVICTED_ATTENTION)
    return reference(input_ids=ids, **{KEEP_KWARG: keep}).logits[0].float()


@torch.no_grad()
def greedy_steps(model, cache, next_logits: torch.Tensor, position: int, steps: int):
    """Greedy tokens and the logits before each: ``(tokens (steps,), logits (steps + 1, vocab))``."""
    logits, tokens = [next_logits[0]], []
    for step in range(steps):
        token = logits[-1].argmax()
        tokens.append(int(token))
        out = model(
            input_ids=token.view(1, 1), position_ids=torch.tensor([[position + step]]), **cache_kwargs(cache)
        )
        logits.append(out.logits[0, -1].float())
    return torch.tensor(tokens), torch.stack(logits)


def check_decodes_as_masked(model, compressor, compressed, ids: torch.Tensor, keep: torch.Tensor) -> None:
    """``compressed`` (``compressor``'s compression of the ``(1, S)`` prompt ``ids``, keeping ``keep (layers,
    kv_heads, S)``) decodes as the full cache with the evicted keys masked: four greedy steps' logits, then a
    question appended to a fresh compression and answered (question-agnostic)."""
    prompt_len = ids.shape[1]
    tokens, got = greedy_steps(model, compressed.cache, compressed.next_logits, prompt_len, steps=4)
    want = evicted_reference_logits(model, torch.cat([ids[0], tokens])[None], keep)
    torch.testing.assert_close(got, want[prompt_len - 1 :], atol=1e-5, rtol=0)
    question = torch.tensor([5, 6, 7, 8])
    answer = compressor.answer(compressor.compress(ids), question, Sampling(max_new_tokens=4))
    sequence = torch.cat([ids[0], question, torch.tensor(answer.token_ids[:-1])])[None]
    reference = evicted_reference_logits(model, sequence, keep)[prompt_len + len(question) - 1 :]
    assert answer.token_ids == reference.argmax(dim=-1).tolist()[: len(answer.token_ids)]


def naive_select(row: list[float], budget: int, sink: int, recent: int, kernel: int) -> list[int]:
    """One head: max-pool the finite scores, force sink/recent/+inf, take the best (earlier wins ties)."""
    length = len(row)
    always = {j for j in range(length) if row[j] == math.inf or j < sink or j >= length - recent}
    finite = [v for v in row if v != math.inf]
    plain = [max(finite) if v == math.inf else v for v in row]
    pooled = [max(plain[max(0, j - kernel // 2) : j + kernel // 2 + 1]) for j in range(length)]
    ranked = sorted(range(length), key=lambda j: (j not in always, -pooled[j], j))
    return sorted(ranked[:budget])
