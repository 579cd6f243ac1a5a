"""`lkv label`'s settings, checked as one frozen :class:`LabelSettings` before any model loads.

Its types are light (no torch), as `lkv label`'s signature: `lkv label --help` answers at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from lkv.labels.prompts import Prompt, PromptSource


@dataclass(frozen=True)
class LabelSettings:
    """The options of ``lkv label``, named as on the command line (see :func:`lkv.commands.label.label` for
    each), checked on construction: a bad one raises ``ValueError`` naming its ``--flag`` (or ``prompts``).

    Construction also lists the source's prompts once (:attr:`all_prompts`: at least one, unique ids).
    """

    output: str
    prompts: PromptSource
    model: str
    response_tokens: int
    max_prompt_tokens: int
    truncation: Literal["middle", "left", "skip", "error"]
    store_scores: bool
    score_dtype: Literal["float16", "float32"] | None
    shard_size: int
    dtype: str
    attn_implementation: str
    batch_size: int
    responses: str | None
    enable_thinking: bool
    accelerator: str
    devices: int | str
    num_nodes: int
    strategy: str
    progress: bool
    label_mode: Literal["aware", "agnostic"]
    gold_answers: bool
    question_reduction: Literal["max", "mean"]
    all_prompts: list[Prompt] = field(init=False)

    def __post_init__(self) -> None:
        from lkv.labels.labeller import LABEL_MODES, QUESTION_REDUCTIONS

        if self.label_mode not in LABEL_MODES:
            raise ValueError(f"--label_mode: expected one of {LABEL_MODES}, found {self.label_mode!r}")
        if self.question_reduction not in QUESTION_REDUCTIONS:
            raise ValueError(
                f"--question_reduction: expected one of {QUESTION_REDUCTIONS}, found {self.question_reduction!r}"
            )
        if self.question_reduction != "max" and self.label_mode != "agnostic":
            raise ValueError(
                "--question_reduction reduces the questions of agnostic labels; aware labels ask one question "
                "(give --label_mode agnostic)"
            )
        if self.label_mode == "agnostic" and not self.store_scores:
            raise ValueError(
                "--label_mode agnostic needs --store_scores true: online targets are computed from the stored "
                "prompt and response alone, and the question would be missing"
            )
        if self.label_mode == "agnostic" and self.responses is not None:
            raise ValueError(
                "--label_mode agnostic generates its responses here; --responses is for aware labels"
            )
        if self.gold_answers and (self.label_mode != "aware" or self.responses is not None):
            raise ValueError(
                "--gold_answers replaces wrong answers generated here in aware labels; it takes neither "
                "--label_mode agnostic nor --responses (put right answers in the responses file instead)"
            )
        for name in ("response_tokens", "max_prompt_tokens", "shard_size", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name}: expected a positive number, found {getattr(self, name)}")
        all_prompts = list(self.prompts)
        if not all_prompts:
            raise ValueError(
                f"prompts: expected at least one prompt, the source yielded none ({self.prompts.describe()})"
            )
        ids = [p.id for p in all_prompts]
        if len(set(ids)) != len(ids):
            duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
            raise ValueError(f"prompts: expected unique prompt ids, found duplicates {duplicates[:5]}")
        object.__setattr__(self, "all_prompts", all_prompts)  # a derived field of the frozen instance
