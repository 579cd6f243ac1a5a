"""Right answers where the labeller's own miss (`lkv label --gold_answers`).

The labels are the attention of the labeller's own response. A small labeller often answers a retrieval
prompt wrong (it names another city, or describes the text), and its labels then teach the module to keep
what the wrong answer attends to rather than the asked fact. Where a prompt carries its expected answer
(``Prompt.answer``), shown to the model, and the response does not contain it, a reference response is
teacher-forced in its place: the sentence of the prompt that states the answer (``Prompt.meta["evidence"]``, which
:class:`~lkv.labels.builtin_prompts.BuiltinPrompts` records for its facts), else the answer itself. Its labels
are the attention that a right answer pays to the prompt (experiments/reach/sections/12_right_answers.md).

A prompt that asks several facts (:class:`~lkv.labels.task_mix.TaskMixPrompts`' document questions) lists them in
``meta["answers"]``, one ``{"answer": ..., "evidence": ...}`` each: its response must contain every answer, and
its reference states each shown one in turn.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from lkv.labels.prompts import Prompt


def asked(prompt: Prompt) -> list[tuple[str, str | None]]:
    """The ``(answer, evidence)`` pairs that ``prompt`` asks for: ``meta["answers"]`` where it lists them, else
    its one ``answer`` and ``meta["evidence"]`` (None where it records none); empty without an answer."""
    if prompt.answer is None:
        return []
    if "answers" in prompt.meta:
        return [(item["answer"], item.get("evidence")) for item in prompt.meta["answers"]]
    return [(prompt.answer, prompt.meta.get("evidence"))]


def missed(prompt: Prompt, response_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether ``prompt`` has a checkable answer that the response ``response_ids`` does not contain (any of
    them, for a prompt asking several)."""
    wanted = asked(prompt)
    if not wanted:
        return False
    response = tokenizer.decode(response_ids)
    return any(answer not in response for answer, _ in wanted)


def reference_response(
    prompt: Prompt,
    shown: str,
    tokenizer: PreTrainedTokenizerBase,
    end_id: int,
    response_tokens: int,
) -> list[int] | None:
    """The reference response's token ids ``(≤ response_tokens,)`` for a prompt whose answer was missed;
    None when ``shown`` (the prompt as rendered, after any truncation) holds none of its answers: a reference
    to a fact the model was not shown would label attention to nothing that states it.

    The reference states each asked answer that ``shown`` holds, in the order asked: its evidence where
    ``shown`` holds that sentence whole (else the answer), joined by spaces; in the tokenizer's own tokens, cut
    to ``response_tokens - 1`` and ended by ``end_id`` (the end-of-turn token a generated answer ends with).
    """
    parts = [
        evidence if evidence is not None and evidence in shown else answer
        for answer, evidence in asked(prompt)
        if answer in shown
    ]
    if not parts:
        return None
    ids = tokenizer(" ".join(parts), add_special_tokens=False).input_ids[: response_tokens - 1]
    return ids + [end_id]
