"""Chat templating around one user turn: the template's opening and closing, and the split of a prompt into a
context (compressed first, question-agnostic) and a question (appended after).

Labels (question-agnostic targets) and evaluation (both settings) cut a prompt with these same functions, so
they cut it at the same token. Every rendering passes the same template variables
(:func:`template_kwargs`): thinking is off unless asked for, so Qwen3's template closes an empty
``<think></think>`` block and the model answers at once instead of reasoning first (templates that do not
read the variable ignore it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the prompt sources import this module while a verb's options are parsed
    from transformers import PreTrainedTokenizerBase

# Stands in for the user's text while the chat template is rendered, to split the template around it.
_PLACEHOLDER = "\x00lkv-content\x00"


def template_kwargs(enable_thinking: bool = False) -> dict[str, Any]:
    """The variables every chat template is rendered with (label folders record them in ``meta.json`` as
    ``extra.chat_template_kwargs``, eval folders in ``run.json``)."""
    return {"enable_thinking": enable_thinking}


def render_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], enable_thinking: bool = False
) -> str:
    """``messages`` under the tokenizer's chat template, opening the assistant's turn (text, not tokens)."""
    return _render(tokenizer, messages, **template_kwargs(enable_thinking))


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], **variables: Any) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **variables)


def template_reads_variables(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders differently with :func:`template_kwargs` than without them (Qwen3's
    does; SmolLM2's and Llama 3's do not, so prompts rendered before the variables were passed are the same)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    message = [{"role": "user", "content": _PLACEHOLDER}]
    plain = _render(tokenizer, message)
    return any(render_chat(tokenizer, message, thinking) != plain for thinking in (False, True))


def chat_parts(tokenizer: PreTrainedTokenizerBase, enable_thinking: bool = False) -> tuple[str, str]:
    """``(prefix, suffix)`` of the tokenizer's chat template around one user message (empty without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return "", ""
    rendered = render_chat(tokenizer, [{"role": "user", "content": _PLACEHOLDER}], enable_thinking)
    prefix, found, suffix = rendered.partition(_PLACEHOLDER)
    if not found:
        raise ValueError("the tokenizer's chat template drops the user message; pass token ids instead")
    return prefix, suffix


def encode_context(
    tokenizer: PreTrainedTokenizerBase, context: str, enable_thinking: bool = False
) -> list[int]:
    """Question-agnostic context tokens: the chat template's opening + ``context`` (the user turn stays open)."""
    prefix, _ = chat_parts(tokenizer, enable_thinking)
    return tokenizer(prefix + context, add_special_tokens=False)["input_ids"]


def encode_question(
    tokenizer: PreTrainedTokenizerBase, question: str, separator: str = "\n\n", enable_thinking: bool = False
) -> list[int]:
    """Tokens appended to an (encoded) context: ``separator + question`` + the template's closing."""
    _, suffix = chat_parts(tokenizer, enable_thinking)
    return tokenizer(separator + question + suffix, add_special_tokens=False)["input_ids"]
