"""Needle in a haystack over held-out essays: a context-length × needle-depth grid, string-match score.

The needle and question follow RULER's single-needle task (``niah_single_2``): "One of the special magic
numbers for <word> is: <7-digit number>." hidden in essay text, asked for after the text, with RULER's
answer prefix opening the model's turn. Keys are words of the held-out essays themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.ruler import NIAH_NEEDLE, niah_wording
from lkv.eval.tasks.text import HeldoutEssays, insert_at_depths, rng_for
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WORDING = niah_wording("numbers", singular=True)


class NeedleTask(GeneratedTask):
    """Needle-in-a-haystack on held-out essays.

    Args:
        lengths: haystack sizes in tokens (the prompt adds ~70 tokens of instructions and question).
        depths: needle depths, the share of the haystack's tokens before the needle (0 = first sentence).
        samples_per_cell: needles per (length, depth) cell, each with its own key, value and haystack.
        max_new_tokens: answer length (a 7-digit number needs ~10 tokens).
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    name = "niah"
    metric = "string_match"
    settles_at_full_score = True  # string_match_all: a found value stays found

    def __init__(
        self,
        lengths: tuple[int, ...] = (1024, 2048),
        depths: tuple[float, ...] = (0.1, 0.5, 0.9),
        samples_per_cell: int = 1,
        max_new_tokens: int = 16,
        seed: int = 0,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        super().__init__(
            lengths, seed, heldout_fraction, max_new_tokens, depths, samples_per_cell=samples_per_cell
        )
        self.essays_dir = essays_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        essays = HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction)
        out = []
        for length in self.lengths:
            for depth in self.depths:
                for index in range(self.samples_per_cell):
                    out.append(self._sample(essays, length, depth, index))
        return out

    def _sample(self, essays: HeldoutEssays, length: int, depth: float, index: int) -> Sample:
        rng = rng_for("niah", self.seed, length, depth, index)
        key = rng.choice(essays.words)
        value = str(rng.randrange(1_000_000, 10_000_000))
        haystack = essays.take(length, start=rng.randrange(len(essays.sentences)))
        body = insert_at_depths(haystack, [NIAH_NEEDLE.format(kind="numbers", key=key, value=value)], [depth])
        return Sample(
            id=f"niah-L{length}-d{depth:g}-s{self.seed}-{index}",
            context=f"{WORDING['intro']}\n{' '.join(body)}\n",
            question=WORDING["question"].format(query=key),
            answers=[value],
            max_new_tokens=self.max_new_tokens,
            answer_prefix=WORDING["answer_prefix"].format(query=key),
            meta={"length": length, "depth": depth, "docs": sorted({s.doc_id for s in haystack})},
        )

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}
