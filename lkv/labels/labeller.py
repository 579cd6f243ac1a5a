"""Ground-truth importance: the model's own response and the attention it pays to the prompt (`lkv label`).

Per prompt there is exactly one prefill. The response is decoded greedily from that cache; the cache is
then cropped back to the prompt and the response is teacher-forced once on top of it with an
:class:`~lkv.core.attention.ImportanceCapture`, which reduces the response rows on the fly. No ``S × S``
matrix, no LM head over the prompt, no second prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from lkv import __version__
from lkv.core.chat import encode_context, encode_question
from lkv.core.generation import append_tokens, crop_to, decode, prefill
from lkv.core.importance import response_importance
from lkv.labels.shards import LabelMeta

LABEL_MODES = ("aware", "agnostic")
#: How the importances of a context's questions become one label (:func:`reduce_questions`).
QUESTION_REDUCTIONS = ("max", "mean")


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
    follows ``truncation`` on the context's tokens (:func:`cut_context`); the question is never cut.
    ``enable_thinking`` is the chat template's variable, as :func:`lkv.labels.prompts.render_prompt` passes it.
    """
    if not content.endswith("\n\n" + question):
        raise ValueError(f"the prompt does not end with its question {question[:60]!r}")
    context = encode_context(tokenizer, content[: -len(question) - 2], enable_thinking)
    asked = encode_question(tokenizer, question, enable_thinking=enable_thinking)
    kept = cut_context(context, len(asked), max_prompt_tokens, truncation)
    return None if kept is None else (kept, asked)


def split_questions(
    tokenizer,
    context: str,
    questions: Sequence[str],
    max_prompt_tokens: int,
    truncation: str,
    enable_thinking: bool = False,
) -> tuple[list[int], list[list[int]]] | None:
    """``(context_ids, [question_ids, ...])`` of a context asked several questions, each appended alone.

    Encoded as the multi-question evaluation encodes its samples (:func:`lkv.eval.tasks.encode_sample` of a
    sample whose ``context`` is this text, ending with its own separator, e.g. ``"...\n\n"``): the context
    with the chat template's opening, each question with no separator and the template's closing. So the
    context ids are exactly the tokens that evaluation prefills and compresses. The context is cut to leave
    room for the longest question (:func:`cut_context`); ``None`` under ``truncation="skip"``.

    Raises:
        ValueError: no question, or an over-long prompt under ``truncation="error"``.
    """
    if not questions:
        raise ValueError("a multi-question prompt needs at least one question (k ≥ 1), found none")
    asked = [encode_question(tokenizer, q, separator="", enable_thinking=enable_thinking) for q in questions]
    ids = encode_context(tokenizer, context, enable_thinking)
    kept = cut_context(ids, max(map(len, asked)), max_prompt_tokens, truncation)
    return None if kept is None else (kept, asked)


def cut_context(
    context: list[int], reserve: int, max_prompt_tokens: int, truncation: str
) -> list[int] | None:
    """``context`` when it and ``reserve`` more tokens (the question) fit in ``max_prompt_tokens``; else cut by
    ``truncation`` (``middle`` keeps both ends, ``left`` the end; ``skip`` returns None; ``error`` raises)."""
    overflow = len(context) + reserve - max_prompt_tokens
    if overflow <= 0:
        return context
    if truncation == "skip":
        return None
    keep = len(context) - overflow
    if truncation == "error" or keep <= 0:
        raise ValueError(
            f"prompt of {len(context) + reserve} tokens is over max_prompt_tokens={max_prompt_tokens} "
            f"(truncation={truncation!r}, question {reserve} tokens)"
        )
    if truncation == "middle":
        head = keep // 2
        return context[:head] + context[len(context) - (keep - head) :]
    return context[overflow:]


def reduce_questions(scores: Sequence[torch.Tensor], reduction: str) -> torch.Tensor:
    """One importance ``(layers, kv_heads, S)`` from each question's ``(layers, kv_heads, S)``, rows summing to 1.

    ``max``: the element-wise maximum (the union: a token any question needs ranks as high as for that
    question, the multi-question Oracle's rule), renormalised so each row sums to 1 again (the ranking is the
    maximum's). ``mean``: the average (already normalised). One question: its own scores.
    """
    if reduction not in QUESTION_REDUCTIONS:
        raise ValueError(f"question_reduction: expected one of {QUESTION_REDUCTIONS}, found {reduction!r}")
    if not scores:
        raise ValueError("no question to reduce: a context needs at least one question (k ≥ 1)")
    if len(scores) == 1:
        return scores[0]
    stacked = torch.stack(list(scores))
    if reduction == "mean":
        return stacked.mean(0)
    union = stacked.amax(0)
    return union / union.sum(-1, keepdim=True)


@torch.no_grad()
def label_questions(
    model: PreTrainedModel,
    context_ids: list[int],
    questions: Sequence[list[int]],
    response_tokens: int,
    eos_token_ids: list[int],
    reduction: str = "max",
) -> Label:
    """Question-agnostic label of a context asked ``k = len(questions)`` questions.

    The context is prefilled once, alone, as the multi-question evaluation prefills it before it appends each
    question (:func:`~lkv.core.generation.append_tokens`; one prefill instead of ``k``). Each question is then
    labelled on that cache as :func:`label_prompt` with ``question_ids`` labels it (its greedy response; the
    attention of the question's and the response's queries on the context), the cache cropped back to the
    context before the next, and the ``k`` importances are reduced to one (:func:`reduce_questions`). The
    context's K/V of one prefill equal those of a prefill with the question to float rounding, so the scores
    equal :func:`label_prompt`'s to ~1e-6.

    Returns:
        response ids: the ``k`` responses one after another, in question order (a record of the answers; the
        target is the stored scores, which agnostic labels always keep); scores ``(layers, kv_heads,
        len(context_ids))``.
    """
    if not questions:
        raise ValueError("a multi-question prompt needs at least one question (k ≥ 1), found none")
    device = next(model.parameters()).device
    length = len(context_ids)
    cache, _ = prefill(model, torch.tensor([context_ids], device=device))
    responses, scores = [], []
    for question in questions:
        logits = append_tokens(model, cache, torch.tensor([question], device=device), length)
        response = decode(model, cache, logits, length + len(question), response_tokens, eos_token_ids)
        crop_to(cache, length)
        queries = torch.tensor([list(question) + response], device=device)
        scores.append(response_importance(model, cache, length, queries))  # leaves the context's cache
        responses += response
    return Label(responses, reduce_questions(scores, reduction))


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
