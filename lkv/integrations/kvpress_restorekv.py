"""lkv's RestoreKV against NVIDIA kvpress's ``RestoreKVPress`` on one model, one prompt and one restore folder.

kvpress loads its restore weights from the hub (``higokri/RestoreKV-<model>``); here the folder an lkv
:class:`~lkv.model.restore.RestoreAdapter` saved is given to it instead, without the hub: the press's
``restore_model_name`` is preset to the name ``post_init_from_model`` derives (so it loads nothing), its
``restore_embeddings`` are read from the folder and the peft LoRA is loaded with ``model.load_adapter(folder,
adapter_name=...)``, on a copy of the model (kvpress injects the LoRA in place, as lkv does).

kvpress runs its KVzip prefill and reconstruction, the restore pass and its selection at the ratio that keeps
``C − n`` context entries per KV head (``layerwise=True``: ``(C − n) · kv_heads`` per layer, its own choice over
the heads; lkv: ``head_budget: adaptive, safeguard: 0``), or the top-``C − n`` of its scores per head (lkv's equal
budgets). Its restore tokens' K/V are the cache's last ``n`` entries after the press.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvpress import RestoreKVPress as KvpressRestoreKV
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.cache import AppendedKV
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses.restorekv import RestoreKVPress
from lkv.eviction.selector import Selection
from lkv.integrations.kvpress_reference import kept_from_masked, overlaps
from lkv.model.restore import RESTORE_EMBEDDINGS_FILE, RestoreAdapter


@dataclass
class _Recorder(KvpressRestoreKV):
    """kvpress's RestoreKV with its final step recorded: its scores and the entries it keeps per head."""

    kept: list[torch.Tensor] = field(default_factory=list)
    scores: torch.Tensor | None = None

    def compress_post(self, model: PreTrainedModel) -> None:
        super().compress_post(model)  # the restore pass, then KVzip's selection at the raised ratio
        kv_heads, length = self.score_val.shape[2:]
        self.scores = self.score_val[:, 0].float().cpu().clone()  # (layers, kv_heads, S), sinks on top
        self.kept = [
            kept_from_masked(layer.self_attn.masked_key_indices, kv_heads, length)
            for layer in model.model.layers
        ]


@dataclass(frozen=True)
class KvpressRun:
    """What kvpress's RestoreKV did: ``kept`` per layer ``(1, kv_heads, W)`` context positions (its own
    layer-wise selection), ``scores (layers, kv_heads, S)``, and the restore tokens' K/V."""

    kept: list[torch.Tensor]
    scores: torch.Tensor
    restored: AppendedKV


def kvpress_press(
    net: PreTrainedModel, folder: str | Path, budget: int, prompt_len: int, n_sink: int
) -> KvpressRestoreKV:
    """kvpress's ``RestoreKVPress(layerwise=True, n_sink=n_sink)`` (recording its last step) with ``folder``'s
    restore weights, without the hub: its LoRA is loaded into ``net`` (in place, off), and its ratio keeps
    ``budget`` entries per KV head of a ``prompt_len``-token context, restore slots included.
    ``net.config.name_or_path`` must hold its tokenizer (kvpress's KVzip loads it from there)."""
    folder = Path(folder)
    kv_heads = net.config.num_key_value_heads
    # layer-wise, kvpress evicts int(kv_heads · S · (ratio + n / S)) entries of each layer: keep C · kv_heads
    ratio = (kv_heads * (prompt_len - budget) + 0.5) / (kv_heads * prompt_len)
    press = _Recorder(compression_ratio=ratio, n_sink=n_sink, layerwise=True)
    press.restore_model_name = f"higokri/RestoreKV-{net.config.name_or_path.split('/')[-1]}"
    embeddings = load_file(str(folder / RESTORE_EMBEDDINGS_FILE))[RestoreAdapter.embeddings_key]
    press.restore_embeddings = embeddings.to(net.device, dtype=net.dtype)
    net.load_adapter(str(folder), adapter_name=press.adapter_name)
    net.disable_adapters()
    return press


def kvpress_restorekv(
    model: PreTrainedModel, ids: torch.Tensor, folder: str | Path, budget: int, n_sink: int
) -> KvpressRun:
    """:func:`kvpress_press` on a copy of ``model`` run on the context ``ids (1, S)`` as kvpress's pipeline
    prefills it: what it kept and restored."""
    net = copy.deepcopy(model)
    prompt_len = ids.shape[1]
    press = kvpress_press(net, folder, budget, prompt_len, n_sink)
    cache = DynamicCache(config=net.config)
    with press(net), torch.no_grad():
        net.model(input_ids=ids, past_key_values=cache)
    expected = net.config.num_key_value_heads * (budget - press.num_restore_tokens)
    if int((press.kept[0] >= 0).sum()) != expected:
        raise RuntimeError(
            f"kvpress kept {int((press.kept[0] >= 0).sum())} entries in layer 0, not {expected}"
        )
    keys = [layer.keys[:, :, prompt_len:] for layer in cache.layers]
    values = [layer.values[:, :, prompt_len:] for layer in cache.layers]
    return KvpressRun(press.kept, press.scores, AppendedKV(keys, values, prompt_len))


@dataclass(frozen=True)
class Parity:
    """lkv's RestoreKV against kvpress's at one budget.

    Attributes:
        layerwise: overlap per layer and KV head of the context entries kept under lkv's ``adaptive, safeguard
            0`` and kvpress's layer-wise selection.
        per_head: the same for lkv's equal budgets and the top-``C − n`` of kvpress's scores per head.
        key_error, value_error: the largest absolute difference of the restore tokens' keys and values.
    """

    layerwise: list[float]
    per_head: list[float]
    key_error: float
    value_error: float


def restorekv_parity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    ids: torch.Tensor,
    folder: str | Path,
    budget: int,
    n_sink: int,
) -> Parity:
    """kvpress's run (:func:`kvpress_restorekv`, on a copy of ``model``) and lkv's (the folder loaded on another
    copy) compared; ``n_sink``: kvpress's sink, the chat template's opening that lkv's KVzip keeps."""
    reference = kvpress_restorekv(model, ids, folder, budget, n_sink)
    press = RestoreKVPress.from_folder(folder, copy.deepcopy(model))
    n = press.num_tokens
    runs = {}
    for head_budget in ("adaptive", "equal"):
        selection = Selection(head_budget=head_budget, safeguard=0.0)
        net = press.adapter.base_model
        runs[head_budget] = Compressor(net, tokenizer, press, budget, selection).compress(ids)
    per_head_reference = [
        reference.scores[layer : layer + 1].topk(budget - n, dim=-1).indices.sort(dim=-1).values
        for layer in range(len(reference.scores))
    ]
    compressed = runs["adaptive"]
    layers = compressed.cache.layers
    key_error = max(
        float((layers[i].keys[:, :, -n:] - k).abs().max()) for i, k in enumerate(reference.restored.keys)
    )
    value_error = max(
        float((layers[i].values[:, :, -n:] - v).abs().max()) for i, v in enumerate(reference.restored.values)
    )
    return Parity(
        overlaps([index[..., :-n] for index in compressed.kept], reference.kept),
        overlaps([index[..., :-n] for index in runs["equal"].kept], per_head_reference),
        key_error,
        value_error,
    )
