"""Chat templating around one user turn: the template's opening and closing, and the split of a prompt into a
context (compressed first, question-agnostic) and a question (appended after).

Labels (question-agnostic targets) and evaluation (both settings) cut a prompt with these same functions, so
they cut it at the same token.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

# Stands in for the user's text while the chat template is rendered, to split the template around it.
_PLACEHOLDER = "\x00lkv-content\x00"


def chat_parts(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str]:
    """``(prefix, suffix)`` of the tokenizer's chat template around one user message (empty without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": _PLACEHOLDER}], add_generation_prompt=True, tokenize=False
    )
    prefix, found, suffix = rendered.partition(_PLACEHOLDER)
    if not found:
        raise ValueError("the tokenizer's chat template drops the user message; pass token ids instead")
    return prefix, suffix


def encode_context(tokenizer: PreTrainedTokenizerBase, context: str) -> list[int]:
    """Question-agnostic context tokens: the chat template's opening + ``context`` (the user turn stays open)."""
    prefix, _ = chat_parts(tokenizer)
    return tokenizer(prefix + context, add_special_tokens=False)["input_ids"]


def encode_question(tokenizer: PreTrainedTokenizerBase, question: str, separator: str = "\n\n") -> list[int]:
    """Tokens appended to an (encoded) context: ``separator + question`` + the template's closing."""
    _, suffix = chat_parts(tokenizer)
    return tokenizer(separator + question + suffix, add_special_tokens=False)["input_ids"]
