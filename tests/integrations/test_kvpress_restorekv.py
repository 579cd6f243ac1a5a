"""lkv's RestoreKV keeps what NVIDIA kvpress's ``RestoreKVPress`` keeps and restores the same K/V, with restore
weights made by lkv (random embeddings + a random peft LoRA saved as a folder) and loaded into kvpress without
the hub (docs/kvpress.md).

Runs in the kvpress environment (``make kvpress-test``); skipped where kvpress is not installed.
"""

import copy

import pytest
import torch

pytest.importorskip("kvpress")

from transformers import DynamicCache  # noqa: E402

from lkv.core.generation import Sampling  # noqa: E402
from lkv.eviction.compressor import Compressor  # noqa: E402
from lkv.eviction.presses.restorekv import RestoreKVPress  # noqa: E402
from lkv.eviction.selector import Selection  # noqa: E402
from lkv.integrations.kvpress_reference import kvzip_sink  # noqa: E402
from lkv.integrations.kvpress_restorekv import kvpress_press, restorekv_parity  # noqa: E402
from lkv.model.restore import RestoreAdapter  # noqa: E402
from tests.conftest import FAMILIES, build_tiny_model  # noqa: E402

PROMPT_LEN = 160
N = 8
BUDGETS = (24, 48, PROMPT_LEN // 2)


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request, tmp_path_factory):
    model, tokenizer = build_tiny_model(request.param)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)  # kvpress's KVzip loads the tokenizer from the model's folder
    model.config.name_or_path = str(folder)
    text = torch.randint(3, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": tokenizer.decode(text)}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = (ids if isinstance(ids, torch.Tensor) else ids["input_ids"])[:, :PROMPT_LEN]
    # restore weights made by lkv on a copy: random embeddings, a non-zero LoRA
    build, _ = build_tiny_model(request.param)
    adapter = RestoreAdapter.create(build, num_tokens=N, lora_rank=4, init="normal", seed=0)
    generator = torch.Generator().manual_seed(1)
    for name, param in adapter.trainable_parameters().items():
        if "lora_B" in name:
            param.data.copy_(0.2 * torch.randn(param.shape, generator=generator))
    restore = tmp_path_factory.mktemp("restore")
    adapter.save(restore)
    return model, tokenizer, ids, restore


@pytest.mark.parametrize("budget", BUDGETS)
def test_restorekv_keeps_kvpress_sets_and_restores_its_kv(setup, budget):
    model, tokenizer, ids, restore = setup
    parity = restorekv_parity(model, tokenizer, ids, restore, budget, kvzip_sink(tokenizer, ids))
    assert min(parity.layerwise) == 1.0, f"C={budget}: layer-wise overlap {min(parity.layerwise):.3f}"
    assert min(parity.per_head) == 1.0, f"C={budget}: per-head overlap {min(parity.per_head):.3f}"
    assert parity.key_error < 1e-5 and parity.value_error < 1e-5, parity


def test_kvpress_cache_answers_as_lkv_restorekv(setup):
    """End to end: greedy answers from kvpress's RestoreKV cache (its evicted keys masked by kvpress's own
    attention patch, the restore tokens' K/V after the context, the question and answer at ``S + n`` on) are
    lkv's Compressor's (``adaptive, safeguard 0``). The question is fed one token at a time: on these tiny
    random models kvpress's fake-key search fails for a whole block of queries."""
    model, tokenizer, ids, restore = setup
    question = [5, 6, 7, 8]
    budget = PROMPT_LEN // 2
    net = copy.deepcopy(model)
    press = kvpress_press(net, restore, budget, PROMPT_LEN, kvzip_sink(tokenizer, ids))
    cache = DynamicCache(config=net.config)
    with press(net), torch.no_grad():
        net.model(input_ids=ids, past_key_values=cache)  # KVzip, the restore pass and eviction on exit
    assert cache.get_seq_length() == PROMPT_LEN + N
    with torch.no_grad():
        tokens = question[:]
        for step in range(len(question) + 5):
            logits = net(input_ids=torch.tensor([[tokens[step]]]), past_key_values=cache).logits[0, -1]
            if step >= len(question) - 1:
                tokens.append(int(logits.argmax()))
    got = tokens[len(question) :]

    mine = RestoreKVPress.from_folder(restore, copy.deepcopy(model))
    selection = Selection(head_budget="adaptive", safeguard=0.0)
    compressor = Compressor(mine.adapter.base_model, tokenizer, mine, budget, selection)
    want = compressor.answer(compressor.compress(ids), question, Sampling(max_new_tokens=len(got))).token_ids
    assert got[: len(want)] == want, (got, want)  # lkv's answer ends at an EOS
