"""lkv's baselines keep what NVIDIA kvpress's implementations keep, at matched settings (docs/kvpress.md).

Runs in the kvpress environment (``make kvpress-test``); skipped where kvpress is not installed.
"""

import pytest
import torch

pytest.importorskip("kvpress")

from lkv.integrations.kvpress_reference import default_checks, kvzip_sink, reference_overlaps  # noqa: E402
from tests.conftest import FAMILIES, build_tiny_model  # noqa: E402

PROMPT_LEN = 160
WINDOW = 16
# Matched settings: kvpress's conventions as lkv options. The defaults that follow the papers instead
# (avg pooling over real values, H2O's attention sum, TOVA per KV group) are the other rows of the table.
MATCHED = [
    "snapkv (avg_zero_pad)",
    "pyramidkv (avg_zero_pad)",
    "streamingllm",
    "tova",
    "h2o (visible_mean)",
    "expected_attention",
    "keydiff",
    "adakv(snapkv)",
    "kvzip",
    "kvzip (adaptive, layerwise)",
]
# The papers' conventions, which lkv keeps as defaults: the check must see them differ on these prompts.
DIFFERING = ["snapkv", "pyramidkv", "tova (kv_group)", "adakv(snapkv) (avg)", "kvzip (kvpress n_sink=4)"]


@pytest.fixture(scope="module", params=FAMILIES)
def overlaps(request, tmp_path_factory) -> dict[tuple[str, str], list[float]]:
    model, tokenizer = build_tiny_model(request.param, attn_implementation="eager")
    # kvpress's KVzip loads the tokenizer from the model's folder
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    model.config.name_or_path = str(folder)
    text = torch.randint(3, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": tokenizer.decode(text)}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = (ids if isinstance(ids, torch.Tensor) else ids["input_ids"])[:, :PROMPT_LEN]
    checks = default_checks(kvzip_sink(tokenizer, ids), window=WINDOW)
    checks = [check for check in checks if check.label in MATCHED + DIFFERING]
    budgets = {"24": 24, "48": 48, "S/2": PROMPT_LEN // 2}
    return reference_overlaps(model, ids, checks, budgets, tokenizer)


@pytest.mark.parametrize("label", MATCHED)
def test_matched_settings_keep_kvpress_sets(overlaps, label):
    for budget in ("24", "48", "S/2"):
        values = overlaps[(label, budget)]
        assert min(values) == 1.0, f"{label} at C={budget}: overlap {min(values):.3f} (per layer and KV head)"


@pytest.mark.parametrize("label", DIFFERING)
def test_the_papers_conventions_keep_other_tokens(overlaps, label):
    assert min(min(overlaps[(label, budget)]) for budget in ("24", "48", "S/2")) < 1.0
