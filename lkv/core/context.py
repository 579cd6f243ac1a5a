"""The model's context window, checked before any prefill: a prompt and the tokens generated after it must
fit in it.

Past ``max_position_embeddings`` a model meets positions it was never trained on: it answers garbage after a
long, costly prefill. A prompt that does not fit is refused with both lengths, or cut as the user asked:
``left`` keeps its last tokens, ``middle`` its first and last halves (LongBench's truncation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: `Truncate` types the CLI verbs, whose --help loads no transformers
    from transformers import PreTrainedModel

Truncate = Literal["error", "left", "middle"]
TRUNCATE_POLICIES: tuple[str, ...] = ("error", "left", "middle")


def model_context(model: PreTrainedModel) -> int | None:
    """Tokens the model's positions cover (``config.max_position_embeddings``; None when it names none)."""
    context = getattr(model.config, "max_position_embeddings", None)
    return int(context) if context else None


def fit_context(
    ids: list[int], reserve: int, context: int | None, truncate: Truncate, what: str = "the prompt"
) -> list[int]:
    """``ids`` when they and ``reserve`` more tokens (a question, the answer) fit in ``context`` tokens;
    else cut to fit by ``truncate`` (``left``: the last tokens, ``middle``: both ends) or refused.

    Raises:
        ValueError: ``truncate="error"``, or not even ``reserve`` fits; names ``what``, both lengths and the
            ``--truncate`` option.
    """
    if truncate not in TRUNCATE_POLICIES:
        raise ValueError(f"--truncate: expected one of {TRUNCATE_POLICIES}, found {truncate!r}")
    if context is None or len(ids) + reserve <= context:
        return ids
    keep = context - reserve
    if truncate == "error" or keep <= 0:
        raise ValueError(
            f"{what} is {len(ids)} tokens, with the {reserve} after it (question, answer) {len(ids) + reserve}: "
            f"over the model's context of {context} tokens; shorten it"
            + (", or cut it with --truncate left|middle" if keep > 0 else "")
        )
    if truncate == "left":
        return ids[len(ids) - keep :]
    head = keep // 2
    return ids[:head] + ids[len(ids) - (keep - head) :]
