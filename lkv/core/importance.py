"""Ground-truth importance s_GT (docs/design.md §1): the attention a teacher-forced response pays to the prompt."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from lkv.core.attention import ImportanceCapture
from lkv.core.compat import cache_kwargs
from lkv.core.generation import crop_to


@torch.no_grad()
def response_importance(
    model: PreTrainedModel,
    cache: DynamicCache,
    prompt_len: int,
    response_ids: torch.Tensor,
    position_offset: int = 0,
    last_queries: int | None = None,
) -> torch.Tensor:
    """s_GT (docs/design.md §1) for a response teacher-forced on top of a prompt cache.

    Args:
        cache: the prompt's cache, exactly ``prompt_len`` entries long; restored to that length on return.
        response_ids: ``(1, R)`` tokens whose queries are reduced: the response, or (question-agnostic
            labels) the question followed by the response.
        position_offset: the response starts at position ``prompt_len + position_offset`` (a prompt prefilled
            with a position gap, :class:`lkv.train.module.LookaheadKVModule`'s ``max_position_gap``).
        last_queries: reduce only the last this many queries of ``response_ids`` (the Oracle of a
            question-agnostic row: the answer after the appended question); ``None``: every query.

    Returns:
        ``(layers, kv_heads, prompt_len)`` fp32; each ``[l, h]`` row sums to 1.
    """
    if cache.get_seq_length() != prompt_len:
        raise ValueError(f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}")
    # when every response query is captured, the capture's fp32 rows also give the attention output
    capture = ImportanceCapture(prompt_len, last_queries, computes_output=last_queries is None)
    first = prompt_len + position_offset
    positions = torch.arange(first, first + response_ids.shape[1], device=response_ids.device)[None]
    model(
        input_ids=response_ids,
        position_ids=positions,
        **cache_kwargs(cache),
        use_cache=True,
        logits_to_keep=1,
        lkv_capture=capture,
    )
    crop_to(cache, prompt_len)
    return capture.scores(model.config.num_hidden_layers)[0]
