"""SpecKV (Galim et al., 2025): a draft model's answer supplies the queries that score the target's cache.

The draft is any causal LM with the target's tokenizer (e.g. a small model of the same family). Without
one — the embedded default has a single model — the press uses a *self-speculative* draft: the target
truncated to its first ``draft_layers`` decoder layers, sharing the target's embeddings, final norm and LM
head (no weights are copied). It generates greedily from the prompt with its own cache; its tokens are then
teacher-forced through the target (:class:`~lkv.eviction.presses.laq.PseudoQueryPress`).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn
from transformers import PreTrainedModel

from lkv.core.generation import decode, prefill
from lkv.eviction.presses.base import PressContext
from lkv.eviction.presses.laq import PseudoQueryPress


def truncated_draft(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """The first ``num_layers`` decoder layers of ``model`` as a causal LM of the same class, sharing all weights.

    Everything but the decoder layers (embeddings, rotary embedding, final norm, LM head) is the target's own
    module; the draft is built on the meta device first, so nothing is allocated or initialised.
    """
    total = model.config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"draft_layers must be in 1..{total} for this {total}-layer model, got {num_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = type(model)(config)
    decoder, draft_decoder = model.get_decoder(), draft.get_decoder()
    for name, child in decoder.named_children():
        setattr(draft_decoder, name, nn.ModuleList(list(child)[:num_layers]) if name == "layers" else child)
    for name, child in model.named_children():
        if child is not decoder:
            setattr(draft, name, child)
    left = [name for name, tensor in [*draft.named_parameters(), *draft.named_buffers()] if tensor.is_meta]
    if left:
        raise NotImplementedError(
            f"{type(model).__name__}: cannot share {left[:3]} with a truncated draft (unexpected module layout)"
        )
    draft.generation_config = model.generation_config
    return draft.eval()


class SpecKVPress(PseudoQueryPress):
    """SpecKV: ``num_tokens`` greedy draft tokens + the last ``window`` prompt queries score the target's cache.

    Args:
        draft: the draft causal LM (a model, or a name/folder for :func:`lkv.model.backbone.load_backbone`, loaded
            on first use with the target's dtype and device); ``None`` = the self-speculative draft.
        draft_layers: layers of the self-speculative draft (default: a quarter of the target's, at least 1).
        num_tokens, window, kernel, pooling: see :class:`~lkv.eviction.presses.laq.PseudoQueryPress`.
    """

    name = "speckv"

    def __init__(
        self,
        draft: PreTrainedModel | str | None = None,
        draft_layers: int | None = None,
        num_tokens: int = 8,
        window: int = 32,
        kernel: int = 7,
        pooling: str = "max",
    ) -> None:
        super().__init__(num_tokens, window, kernel, pooling)
        if draft is not None and draft_layers is not None:
            raise ValueError("draft_layers sets the self-speculative draft; it cannot go with a draft model")
        if draft_layers is not None and draft_layers < 1:
            raise ValueError(f"draft_layers must be ≥ 1, got {draft_layers}")
        self.draft = draft
        self.draft_layers = draft_layers
        self._drafts: weakref.WeakKeyDictionary[PreTrainedModel, PreTrainedModel] = (
            weakref.WeakKeyDictionary()
        )

    def draft_for(self, target: PreTrainedModel) -> PreTrainedModel:
        """The draft model used with ``target`` (built or loaded once per target)."""
        if isinstance(self.draft, PreTrainedModel):
            return self.draft
        if target not in self._drafts:
            if self.draft is None:
                layers = self.draft_layers or max(1, target.config.num_hidden_layers // 4)
                self._drafts[target] = truncated_draft(target, layers)
            else:
                from lkv.model.backbone import DTYPES, load_backbone

                weights = next(target.parameters())
                dtype = next(name for name, value in DTYPES.items() if value == weights.dtype)
                self._drafts[target] = load_backbone(self.draft, dtype=dtype, device=str(weights.device))[0]
        return self._drafts[target]

    def pseudo_response(self, ctx: PressContext, window_attention: torch.Tensor) -> list[int]:
        draft = self.draft_for(ctx.model)
        cache, logits = prefill(draft, ctx.prompt_ids)
        tokens = decode(draft, cache, logits, ctx.prompt_len, self.num_tokens, ctx.eos_token_ids)
        vocab = ctx.model.get_input_embeddings().num_embeddings
        if max(tokens) >= vocab:
            raise ValueError(
                f"the draft generated token id {max(tokens)}, outside the target's vocabulary of {vocab}: "
                "draft and target must share a tokenizer"
            )
        return tokens
