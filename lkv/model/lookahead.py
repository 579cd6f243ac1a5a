"""The lookahead module: ``M`` learned embeddings + a LoRA adapter that is active only while they run
(:class:`~lkv.model.tokens.TokenAdapter`).

After a prompt's prefill (adapter off, so the cache is exactly the base model's), :meth:`LookaheadAdapter.predict`
appends the ``M`` embeddings at positions ``S..S+M-1`` with the adapter on, reads their attention on the
prompt keys through an :class:`~lkv.core.attention.ImportanceCapture`, then crops their K/V away and switches the
adapter off again. :meth:`LookaheadAdapter.stream` computes the same, one layer at a time beside the prompt's
prefill (layer-streamed eviction, :mod:`lkv.eviction.streamed`). Only the embeddings and the LoRA weights train; the LLM is frozen (docs/design.md §1).

An exported folder (:meth:`LookaheadAdapter.save`) holds::

    lookahead.json                    settings + the base model's signature
    lookahead_embeddings.safetensors  {"embeddings": (M, hidden)} float32
    adapter_config.json, adapter_model.safetensors   peft LoRA files (absent for embeddings-only modules)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import ImportanceCapture
from lkv.core.compat import cache_kwargs, layer_causal_mask
from lkv.core.generation import crop_to
from lkv.model.tokens import TokenAdapter, unreachable_linears

CONFIG_FILE = "lookahead.json"
EMBEDDINGS_FILE = "lookahead_embeddings.safetensors"
#: ``extra`` key of the prompt setting a module was trained for (its labels' setting; written by `lkv export`)
SETTING_KEY = "setting"
#: the settings a module may be trained for: ``aware`` (its lookahead tokens saw the question after the
#: context) or ``agnostic`` (they saw the context alone)
TRAINED_SETTINGS = ("aware", "agnostic")


def exported_base_model(folder: str | Path) -> str | None:
    """The base model an ``lkv export`` folder was exported from (``extra["model"]``), if it says."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("extra", {}).get("model")
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed lookahead config ({err})") from err


def trained_setting(extra: Mapping[str, Any], where: str) -> str:
    """The prompt setting a module was trained for, from its config's ``extra``: ``extra["setting"]``, and
    ``aware`` for a folder exported before modules recorded it (every module then was trained aware).

    Raises:
        ValueError: a value that is not a setting, naming ``where`` (the file).
    """
    setting = extra.get(SETTING_KEY, "aware")
    if setting not in TRAINED_SETTINGS:
        raise ValueError(
            f"{where}: extra.{SETTING_KEY}: expected one of {TRAINED_SETTINGS}, found {setting!r}"
        )
    return setting


class LookaheadAdapter(TokenAdapter):
    """Frozen model + ``M`` lookahead embeddings + a peft LoRA adapter that is active ONLY inside :meth:`predict`
    (and :meth:`stream`).

    Built with :meth:`~lkv.model.tokens.TokenAdapter.create` (training) or :meth:`~lkv.model.tokens.TokenAdapter.load`
    (an exported folder: the module docstring). Outside :meth:`predict` its ``model`` computes exactly the base
    model, so it serves as the model for prefill and decoding. Its LoRA spares the linear layers that cannot
    change the predicted scores (:meth:`excluded_linears`).
    """

    config_file = CONFIG_FILE
    embeddings_file = EMBEDDINGS_FILE
    embeddings_key = "embeddings"

    @classmethod
    def excluded_linears(cls, model: PreTrainedModel) -> list[str]:
        """The last decoder layer's linear layers other than its query and key projections: the predicted
        scores are that layer's attention rows (:func:`~lkv.model.tokens.unreachable_linears`)."""
        return unreachable_linears(model, read=("q_proj", "k_proj"))

    def predict(self, cache: DynamicCache, prompt_len: int, position_offset: int = 0) -> torch.Tensor:
        """Predicted importance of every prompt position.

        Runs the ``M`` embeddings at positions ``S..S+M-1`` on top of the prompt cache with the adapter on
        and reduces their attention on the prompt keys. The cache is cropped back to ``prompt_len`` and the
        adapter switched off even on error. Differentiable when grad is enabled (no LM head is applied).

        Args:
            cache: the prompt's cache from a prefill with the adapter off, exactly ``prompt_len`` entries.
            position_offset: extra positions between the prompt and the lookahead tokens, which then sit at
                ``S+o..S+o+M-1`` (RoPE sees every query–key distance ``o`` tokens longer; the keys, the mask and
                the cache are unchanged). Training draws it at random so that short prompts teach the distances
                of long ones (:class:`lkv.train.module.LookaheadKVModule`, ``max_position_offset``); inference
                uses 0.

        Returns:
            ``(1, layers, kv_heads, S)`` float32; every ``[0, l, h]`` row sums to 1.
        """
        if cache.get_seq_length() != prompt_len:
            raise ValueError(
                f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}"
            )
        base = self.base_model
        decoder = base.get_decoder()
        embeds, positions, capture = self._inputs(prompt_len, position_offset)
        self._set_adapter(True)
        try:
            decoder(
                inputs_embeds=embeds,
                position_ids=positions,
                **cache_kwargs(cache),
                use_cache=True,
                lkv_capture=capture,
            )
        finally:
            crop_to(cache, prompt_len)
            # With grad, the cropped K/V are views of [prompt; lookahead] tensors inside this step's graph: a
            # second lookahead step on the same cache (another module's) would backpropagate into this one.
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
            self._set_adapter(False)
        return capture.scores(base.config.num_hidden_layers)

    def stream(self, cache: DynamicCache, prompt_len: int) -> LookaheadStream:
        """The lookahead tokens' residual stream beside a layer-by-layer prefill of the prompt into ``cache``."""
        return LookaheadStream(self, cache, prompt_len)

    def _inputs(
        self, prompt_len: int, position_offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, ImportanceCapture]:
        """``(embeds (1, M, hidden), positions (1, M), capture)`` of a lookahead step after ``prompt_len`` tokens,
        ``position_offset`` positions further on (see :meth:`predict`)."""
        if position_offset < 0:
            raise ValueError(f"position_offset must be ≥ 0, got {position_offset}")
        embeds = self.embeddings.to(self.base_model.get_input_embeddings().weight.dtype)[None]
        first = prompt_len + position_offset
        positions = torch.arange(first, first + self.config.num_tokens, device=embeds.device)[None]
        # the capture computes the M queries' attention output too: the layer's kernel would repeat its logits
        return embeds, positions, ImportanceCapture(num_keys=prompt_len, computes_output=True)


class LookaheadStream:
    """The ``M`` lookahead tokens run layer by layer beside a prompt's prefill (docs/design.md §1, Eviction).

    The adapter touches only the lookahead tokens and they come last, so at layer ``l`` they need only layer
    ``l``'s prompt K/V and their own hidden state from layer ``l − 1``: :meth:`layer_scores` runs them through
    layer ``l`` as soon as the prompt has passed it, and returns the same scores as :meth:`LookaheadAdapter.predict`
    after a full prefill — while earlier layers may already be evicted and later ones are still empty.

    Args:
        adapter: the lookahead module; cache: the cache the prompt is being prefilled into (adapter off);
        prompt_len: ``S``.
    """

    def __init__(self, adapter: LookaheadAdapter, cache: DynamicCache, prompt_len: int) -> None:
        base = adapter.base_model
        self.decoder = base.get_decoder()
        if not hasattr(self.decoder, "rotary_emb"):
            raise NotImplementedError(
                f"{type(self.decoder).__name__} has no shared rotary embedding: cannot stream the lookahead tokens"
            )
        types = set(getattr(base.config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise NotImplementedError(
                f"layer-streamed lookahead needs full-attention layers only, got {types}"
            )
        self.adapter = adapter
        self.cache = cache
        self.prompt_len = prompt_len
        # (1, M, hidden): the lookahead tokens' residual stream, the output of the last layer run
        self.hidden, self.positions, self.capture = adapter._inputs(prompt_len)
        self.position_embeddings = self.decoder.rotary_emb(self.hidden, position_ids=self.positions)

    def layer_scores(self, layer_idx: int) -> torch.Tensor:
        """Run the lookahead tokens through layer ``layer_idx`` (adapter on) and return their importance.

        Layer ``layer_idx`` of the cache must hold exactly the prompt's ``S`` entries; their K/V are cropped away
        again (and the adapter switched off) even on error.

        Returns:
            ``(1, kv_heads, S)`` float32, summing to 1 over ``S``.
        """
        layer_cache = self.cache.layers[layer_idx]
        if layer_cache.get_seq_length() != self.prompt_len:
            raise ValueError(
                f"layer {layer_idx} of the cache holds {layer_cache.get_seq_length()} entries, expected the "
                f"prompt's {self.prompt_len}"
            )
        # the mask predict's decoder builds, sized from this layer (earlier layers may already be evicted)
        mask = layer_causal_mask(self.decoder.config, self.hidden, self.cache, self.positions, layer_idx)
        self.adapter._set_adapter(True)
        try:
            self.hidden = self.decoder.layers[layer_idx](
                self.hidden,
                attention_mask=mask,
                position_ids=self.positions,
                **cache_kwargs(self.cache),
                use_cache=True,
                position_embeddings=self.position_embeddings,
                lkv_capture=self.capture,
            )
        finally:
            layer_cache.crop(self.prompt_len - layer_cache.get_seq_length())
            self.adapter._set_adapter(False)
        return self.capture.take(layer_idx)
