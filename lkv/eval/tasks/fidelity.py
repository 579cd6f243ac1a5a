"""Fidelity: how close a compressed cache's answer stays to the FullKV answer, on held-out essay QA/summaries.

Open-ended questions have no single right answer, but eviction should not change what the model says.
The reference is the FullKV answer to the same prompt in the same setting; the score is ROUGE-L F1 (and
token F1) between the two.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.metrics import answer_agreement, rouge_l
from lkv.eval.tasks.text import HeldoutEssays, rng_for
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INTRO = "Read the following essay excerpt."
SUMMARY_QUESTIONS = (
    "Summarize the passage in two or three sentences.",
    "What is the author's main claim in this passage, and what evidence is given for it?",
)
TERM_QUESTION = 'What does the passage say about "{term}"?'
_COMMON = {
    "about",
    "which",
    "there",
    "their",
    "would",
    "could",
    "should",
    "these",
    "those",
    "other",
    "people",
}


class FidelityTask(GeneratedTask):
    """Held-out essay passages with a summary or question; scored against the FullKV answer.

    Args:
        lengths: passage sizes in tokens.
        num_samples: samples per length; half ask for a summary, half about a frequent word of the passage.
        max_new_tokens: answer length.
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    name = "fidelity"
    metric = "rouge_l"
    needs_reference = True

    def __init__(
        self,
        lengths: tuple[int, ...] = (1024,),
        num_samples: int = 4,
        max_new_tokens: int = 48,
        seed: int = 0,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        super().__init__(lengths, seed, heldout_fraction, max_new_tokens, num_samples=num_samples)
        self.essays_dir = essays_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        essays = HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction)
        out = []
        for length in self.lengths:
            for index in range(self.num_samples):
                rng = rng_for("fidelity", self.seed, length, index)
                passage = essays.take(length, start=rng.randrange(len(essays.sentences)))
                text = " ".join(s.text for s in passage)
                if index % 2 == 0:
                    question = rng.choice(SUMMARY_QUESTIONS)
                else:
                    words = Counter(w for w in text.lower().split() if w.isalpha() and len(w) > 5)
                    terms = [w for w, _ in words.most_common(8) if w not in _COMMON]
                    question = TERM_QUESTION.format(term=rng.choice(terms)) if terms else SUMMARY_QUESTIONS[0]
                out.append(
                    Sample(
                        id=f"fidelity-L{length}-s{self.seed}-{index}",
                        context=f"{INTRO}\n\n{text}\n\n",
                        question=question,
                        answers=[],
                        max_new_tokens=self.max_new_tokens,
                        meta={"length": length, "docs": sorted({s.doc_id for s in passage})},
                    )
                )
        return out

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        if reference is None:
            raise ValueError(f"{sample.id}: fidelity needs the FullKV answer as reference")
        return {
            "rouge_l": rouge_l(prediction, reference),
            "token_f1": answer_agreement(prediction, reference),
        }
