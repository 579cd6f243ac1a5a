"""Ground-truth importance: the model's own response and the attention it pays to the prompt (`lkv label`).

Per prompt there is exactly one prefill. The response is decoded greedily from that cache; the cache is
then cropped back to the prompt and the response is teacher-forced once on top of it with an
:class:`~lkv.core.attention.ImportanceCapture`, which reduces the response rows on the fly. No ``S × S``
matrix, no LM head over the prompt, no second prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from lkv import __version__
from lkv.core.chat import encode_context, encode_question
from lkv.core.generation import crop_to, decode, prefill
from lkv.core.importance import response_importance
from lkv.labels.shards import LabelMeta

LABEL_MODES = ("aware", "agnostic")


@dataclass
class Label:
    """One labelled prompt: response ``(R,)`` and scores ``(layers, kv_heads, S)`` (None if not kept)."""

    response_ids: list[int]
    scores: torch.Tensor | None


@torch.no_grad()
def label_prompt(
    model: PreTrainedModel,
    prompt_ids: list[int],
    response_tokens: int,
    eos_token_ids: list[int],
    store_scores: bool = True,
    question_ids: list[int] | None = None,
) -> Label:
    """Greedy response (≤ ``response_tokens``) and its ground-truth importance over the prompt.

    Args:
        prompt_ids: the tokens the lookahead module will see: the whole prompt, or with ``question_ids``
            (question-agnostic labels) the context alone.
        question_ids: the question, appended after ``prompt_ids``. The response is generated from context +
            question, and the scores are the attention that the question's *and* the response's queries pay
            to the context's keys: what a module that sees only the context must predict.

    Returns:
        the response and ``(layers, kv_heads, len(prompt_ids))`` scores (None without ``store_scores``).
    """
    device = next(model.parameters()).device
    question = list(question_ids or [])
    ids = torch.tensor([prompt_ids + question], device=device)
    cache, logits = prefill(model, ids)
    response = decode(model, cache, logits, ids.shape[1], response_tokens, eos_token_ids)
    if not store_scores:
        return Label(response, None)
    crop_to(cache, len(prompt_ids))
    queries = torch.tensor([question + response], device=device)
    return Label(response, response_importance(model, cache, len(prompt_ids), queries))


def split_prompt(
    tokenizer,
    content: str,
    question: str,
    max_prompt_tokens: int,
    truncation: str,
    enable_thinking: bool = False,
) -> tuple[list[int], list[int]] | None:
    """``(context_ids, question_ids)`` of a one-turn prompt whose user message ends with ``"\n\n" + question``.

    Encoded as the question-agnostic evaluation encodes a sample (:func:`lkv.core.chat.encode_context` /
    ``encode_question``), so labels and evaluation cut the prompt at the same token. An over-long prompt
    follows ``truncation`` on the context's tokens (``middle`` keeps both ends, ``left`` the end; ``skip``
    returns None; ``error`` raises); the question is never cut. ``enable_thinking`` is the chat template's
    variable, as :func:`lkv.labels.prompts.render_prompt` passes it.
    """
    if not content.endswith("\n\n" + question):
        raise ValueError(f"the prompt does not end with its question {question[:60]!r}")
    context = encode_context(tokenizer, content[: -len(question) - 2], enable_thinking)
    asked = encode_question(tokenizer, question, enable_thinking=enable_thinking)
    overflow = len(context) + len(asked) - max_prompt_tokens
    if overflow <= 0:
        return context, asked
    if truncation == "skip":
        return None
    keep = len(context) - overflow
    if truncation == "error" or keep <= 0:
        raise ValueError(
            f"prompt of {len(context) + len(asked)} tokens is over max_prompt_tokens={max_prompt_tokens} "
            f"(truncation={truncation!r}, question {len(asked)} tokens)"
        )
    if truncation == "middle":
        head = keep // 2
        return context[:head] + context[len(context) - (keep - head) :], asked
    return context[overflow:], asked


def make_meta(
    signature: dict,
    response_tokens: int,
    max_prompt_tokens: int,
    truncation: str,
    score_dtype: str,
    store_scores: bool,
    prompt_source: str,
    extra: dict | None = None,
) -> LabelMeta:
    """Metadata of a label run (the current lkv version filled in); ``extra`` goes to ``LabelMeta.extra``."""
    return LabelMeta(
        model=signature,
        response_tokens=response_tokens,
        max_prompt_tokens=max_prompt_tokens,
        truncation=truncation,
        score_dtype=score_dtype,
        store_scores=store_scores,
        prompt_source=prompt_source,
        lkv_version=__version__,
        extra=dict(extra or {}),
    )
