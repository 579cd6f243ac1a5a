"""RestoreKV's learned restore tokens (arXiv 2608.01247): ``n`` embeddings + a LoRA active only while they run.

After a prompt's prefill (adapter off), :meth:`RestoreAdapter.restore` runs the ``n`` embeddings at positions
``S..S+n-1`` over the *full* cache with the adapter on, in one pass, and returns the K/V they wrote in every
layer; the cache is cropped back to ``S``. An eviction method then keeps those ``n`` entries per KV head beside
the context entries it selects (:class:`lkv.eviction.presses.restorekv.RestoreKVPress`): they carry what the
evicted context held, and were trained to (:class:`lkv.train.restore_module.RestoreKVModule`).

The module is a :class:`~lkv.model.tokens.TokenAdapter` (learned embeddings + a peft LoRA switched on only for
its tokens, as a lookahead module's) with its own folder, laid out as NVIDIA kvpress's ``RestoreKVPress`` reads
a published one::

    restorekv.json                    settings + the base model's signature (``extra["model"]``) and the prompt
                                      setting its labels were made for (``extra["setting"]``; ``aware`` if absent)
    restore_embeddings.safetensors    {"restore_embeddings": (n, hidden)} float32
    adapter_config.json, adapter_model.safetensors   peft LoRA files (absent for embeddings-only modules)
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.cache import AppendedKV
from lkv.core.compat import cache_kwargs
from lkv.core.generation import crop_to
from lkv.model.tokens import TokenAdapter, unreachable_linears

RESTORE_CONFIG_FILE = "restorekv.json"
RESTORE_EMBEDDINGS_FILE = "restore_embeddings.safetensors"
# kvpress's RestoreKVPress loads its LoRA under this peft name (without KVzip+ normalisation)
RESTORE_ADAPTER = "restorekv"
NUM_RESTORE_TOKENS = 8  # the paper's n


class RestoreAdapter(TokenAdapter):
    """Frozen model + ``n`` restore embeddings + a peft LoRA active only inside :meth:`restore`.

    Built with :meth:`~lkv.model.tokens.TokenAdapter.create` / :meth:`~lkv.model.tokens.TokenAdapter.load`
    (its folder: the module docstring). Its LoRA spares only the linear layers that cannot reach the restore
    K/V: the last layer's query, output and MLP projections (:meth:`excluded_linears`).
    """

    config_file = RESTORE_CONFIG_FILE
    embeddings_file = RESTORE_EMBEDDINGS_FILE
    embeddings_key = "restore_embeddings"

    @classmethod
    def excluded_linears(cls, model: PreTrainedModel) -> list[str]:
        """The last decoder layer's linear layers other than its key and value projections: the restore
        tokens' K/V of that layer are read from its input, nothing reads its attention output."""
        return unreachable_linears(model, read=("k_proj", "v_proj"))

    def restore(self, cache: DynamicCache, prompt_len: int) -> AppendedKV:
        """The restore tokens' K/V: the ``n`` embeddings at positions ``S..S+n-1`` over the full prompt cache,
        adapter on, one pass (differentiable when grad is enabled; no LM head runs).

        Args:
            cache: the prompt's cache from a prefill with the adapter off, exactly ``prompt_len`` entries; it
                is cropped back to them (and detached from this pass's graph) and the adapter switched off,
                even on error.

        Returns:
            Per layer ``(1, kv_heads, n, head_dim)`` keys (RoPE applied at ``S..S+n-1``) and values.
        """
        if cache.get_seq_length() != prompt_len:
            raise ValueError(
                f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}"
            )
        embeds = self.embeddings.to(self.base_model.get_input_embeddings().weight.dtype)[None]
        positions = torch.arange(prompt_len, prompt_len + self.config.num_tokens, device=embeds.device)[None]
        self._set_adapter(True)
        try:
            self.base_model.get_decoder()(
                inputs_embeds=embeds, position_ids=positions, **cache_kwargs(cache), use_cache=True
            )
            keys = [layer.keys[:, :, prompt_len:] for layer in cache.layers]
            values = [layer.values[:, :, prompt_len:] for layer in cache.layers]
        finally:
            crop_to(cache, prompt_len)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
            self._set_adapter(False)
        return AppendedKV(keys, values, prompt_len)
