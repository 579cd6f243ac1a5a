"""LookaheadKV: the trained lookahead module predicts the importance the future response will assign.

:func:`load_lookahead` loads an ``lkv export`` folder: its base model, tokenizer and this press.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.eviction.presses.base import (
    LayerScorer,
    Press,
    PressContext,
    StreamContext,
)
from lkv.eviction.selector import check_pooling, pool_scores
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.lookahead import DEFAULT_ADAPTER, LookaheadAdapter, exported_base_model, read_lookahead_folder

# Max-pooling the predicted scores over 7 positions before top-C keeps a value's tokens together; on the
# embedded model it keeps more FullKV-solved needles at C = 128–256, near and far from the end of the prompt,
# on every adapter measured (experiments/reach/README.md). kernel=1 scores without pooling (the paper's).
DEFAULT_KERNEL = 7


class LookaheadKVPress(Press):
    """Scores = :meth:`LookaheadAdapter.predict` on the prompt cache (no window: paper Table 7), optionally
    1-D pooled as SnapKV pools its window's votes.

    The adapter's LoRA is injected into the base model in place and is off outside ``predict``, so the
    prompt's prefill and the decoding run the unchanged base model.

    Args:
        adapter: the trained lookahead module.
        kernel, pooling: 1-D pooling of the predicted scores over the prompt (odd kernel, 1 = none, the paper's;
            default max over 7, :data:`DEFAULT_KERNEL`; see :data:`~lkv.eviction.selector.POOLING_MODES`):
            a kept token keeps its neighbours' chance, so a value spelled over several tokens (a 7-digit number
            is 7 tokens in SmolLM2) is kept whole rather than in part.
    """

    name = "lookaheadkv"
    streamable = True

    def __init__(self, adapter: LookaheadAdapter, kernel: int = DEFAULT_KERNEL, pooling: str = "max") -> None:
        check_pooling(kernel, pooling)
        self.adapter = adapter
        self.kernel = kernel
        self.pooling = pooling

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        model: PreTrainedModel,
        adapter_name: str = DEFAULT_ADAPTER,
        kernel: int = DEFAULT_KERNEL,
        pooling: str = "max",
    ) -> LookaheadKVPress:
        """Load an ``lkv export`` folder on top of ``model`` (which it modifies in place, adapter off); ``model``
        may be another press's ``adapter.model``, to score one prefill with several modules."""
        return cls(LookaheadAdapter.load(folder, model, adapter_name=adapter_name), kernel, pooling)

    @property
    def base_model(self) -> PreTrainedModel:
        """The base model the adapter is injected into (the model to prefill and decode with)."""
        return self.adapter.base_model

    def score(self, ctx: PressContext) -> torch.Tensor:
        self._check_model(ctx.model)
        with torch.no_grad():
            return pool_scores(self.adapter.predict(ctx.cache, ctx.prompt_len), self.kernel, self.pooling)

    def layer_scorer(self, ctx: StreamContext) -> LayerScorer:
        """The lookahead tokens' residual stream beside the prefill (:meth:`LookaheadAdapter.stream`)."""
        self._check_model(ctx.model)
        stream = self.adapter.stream(ctx.cache, ctx.prompt_len)
        return lambda layer: pool_scores(stream.layer_scores(layer), self.kernel, self.pooling)

    def _check_model(self, model: PreTrainedModel) -> None:
        if model is not self.base_model and model is not self.adapter.model:
            raise ValueError(
                "the LookaheadKV adapter was loaded on another model than the one being compressed"
            )


def load_lookahead(
    adapter: str | Path,
    model: str | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, LookaheadKVPress]:
    """``(base model, tokenizer, press)`` for a trained lookahead module in an ``lkv export`` folder.

    Args:
        adapter: an ``lkv export`` folder (:func:`lkv.train.export.resolve_adapter` turns an ``lkv fit``
            checkpoint into one).
        model: the base model; default: the one the folder was exported from, else ``smollm2-135m``.
    """
    path = Path(adapter)
    if not path.is_dir():
        raise FileNotFoundError(f"adapter {str(adapter)!r}: not an `lkv export` folder")
    read_lookahead_folder(path)  # a missing or damaged file is named before the model loads
    net, tokenizer = load_backbone(
        model or exported_base_model(path) or DEFAULT_MODEL,
        dtype=dtype,
        attn_implementation=attn_implementation,
        device=device,
    )
    return net, tokenizer, LookaheadKVPress.from_folder(path, net)
