"""lkv's RestoreKV keeps what NVIDIA kvpress's ``RestoreKVPress`` keeps and restores the same K/V, with restore
weights made by lkv (random embeddings + a random peft LoRA saved as a folder) and loaded into kvpress without
the hub (docs/kvpress.md).

Runs in the kvpress environment (``make kvpress-test``); skipped where kvpress is not installed.
"""

import pytest
import torch

pytest.importorskip("kvpress")

from lkv.integrations.kvpress_reference import kvzip_sink  # noqa: E402
from lkv.integrations.kvpress_restorekv import restorekv_parity  # noqa: E402
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
