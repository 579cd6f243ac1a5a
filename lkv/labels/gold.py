"""Right answers where the labeller's own miss (`lkv label --gold_answers`).

The labels are the attention of the labeller's own response. A small labeller often answers a retrieval
prompt wrong (it names another city, or describes the text), and its labels then teach the module to keep
what the wrong answer attends to rather than the asked fact. Where a prompt carries its expected answer
(``Prompt.answer``), shown to the model, and the response does not contain it, a reference response is
teacher-forced in its place: the sentence of the prompt that states the answer (``Prompt.meta["evidence"]``, which
:class:`~lkv.labels.builtin_prompts.BuiltinPrompts` records for its facts), else the answer itself. Its labels
are the attention that a right answer pays to the prompt (experiments/reach/sections/12_right_answers.md).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from lkv.labels.prompts import Prompt


def missed(prompt: Prompt, response_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``prompt`` has a checkable answer that the response ``response_ids`` does not contain."""
    return prompt.answer is not None and prompt.answer not in tokenizer.decode(response_ids)


def reference_response(
    prompt: Prompt,
    shown: str,
    tokenizer: PreTrainedTokenizerBase,
    end_id: int,
    response_tokens: int,
) -> list[int] | None:
    """The reference response's token ids ``(≤ response_tokens,)`` for a prompt whose answer was missed;
    None when ``shown`` (the prompt as rendered, after any truncation) does not hold the answer: a reference
    to a fact the model was not shown would label attention to nothing that states it.

    The reference is ``prompt.meta["evidence"]`` where ``shown`` holds that sentence whole (else
    ``prompt.answer``), in the tokenizer's own tokens, cut to ``response_tokens - 1`` and ended by ``end_id``
    (the end-of-turn token a generated answer ends with).
    """
    if prompt.answer is None or prompt.answer not in shown:
        return None
    evidence = prompt.meta.get("evidence")
    text = evidence if evidence is not None and evidence in shown else prompt.answer
    ids = tokenizer(text, add_special_tokens=False).input_ids[: response_tokens - 1]
    return ids + [end_id]
