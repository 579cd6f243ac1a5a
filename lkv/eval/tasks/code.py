"""Code completion on held-out Python standard-library source (LongBench-LCC style).

The context is the code before a target line (whole lines, up to ``length`` tokens), the target is the
next line; the prompt is LongBench's ``lcc`` template without a chat template, and the score is the edit
similarity of the first code line of the answer to the target (both stripped of surrounding whitespace).
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path
from typing import TYPE_CHECKING

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.metrics import edit_similarity, first_code_line
from lkv.eval.tasks.text import draw_module, heldout_code, module_lines, rng_for
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INSTRUCTION = "Please complete the code given below. \n"
QUESTION = "Next line of code:\n"


def is_target_line(line: str, min_chars: int) -> bool:
    """A line worth predicting: code of at least ``min_chars`` characters, not a comment or a string line."""
    text = line.strip()
    return len(text) >= min_chars and not text.startswith(("#", '"', "'")) and "`" not in text


def string_rows(text: str) -> set[int] | None:
    """0-based line numbers covered by multi-line strings (docstrings); None if ``text`` is not valid Python."""
    rows: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                rows.update(range(token.start[0] - 1, token.end[0]))
    except (tokenize.TokenError, SyntaxError):
        return None
    return rows


class CodeCompletionTask(GeneratedTask):
    """Next-line completion over held-out standard-library modules.

    Args:
        lengths: context sizes in tokens.
        num_samples: samples per length, each from a randomly drawn module and target line.
        min_line_chars: shortest target line (shorter lines are mostly ``else:`` and brackets).
        max_new_tokens: answer length; the first code line of the answer is scored (the model may open with
            a blank line or a comment, so generation does not stop at the first newline).
        seed: base seed.
        stdlib_dir: Python source tree (default: the running interpreter's standard library).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    name = "code"
    metric = "edit_sim"

    def __init__(
        self,
        lengths: tuple[int, ...] = (1024,),
        num_samples: int = 4,
        min_line_chars: int = 12,
        max_new_tokens: int = 24,
        seed: int = 0,
        stdlib_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        super().__init__(lengths, seed, heldout_fraction, max_new_tokens, num_samples=num_samples)
        self.min_line_chars = min_line_chars
        self.stdlib_dir = stdlib_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        files = heldout_code(self.stdlib_dir, self.heldout_fraction)
        out = []
        for length in self.lengths:
            for index in range(self.num_samples):
                rng = rng_for("code", self.seed, length, index)
                # Draw modules until one is long enough for the context and has a target line after it.
                sample = draw_module(files, rng, 50, self._sample, tokenizer, length, rng)
                if sample is None:
                    raise ValueError(f"no held-out module of {length}+ tokens found in 50 draws")
                sample.id = f"code-L{length}-s{self.seed}-{index}"
                out.append(sample)
        return out

    def _sample(self, doc_id: str, path: Path, tokenizer, length: int, rng) -> Sample | None:
        module = module_lines(tokenizer, path, length)
        if module is None:
            return None
        text, lines, counts = module
        in_strings = string_rows(text)
        if in_strings is None:
            return None
        before = [0]
        for count in counts:
            before.append(before[-1] + count)
        targets = [
            i
            for i, line in enumerate(lines)
            if before[i] >= length and i not in in_strings and is_target_line(line, self.min_line_chars)
        ]
        if not targets:
            return None
        target = rng.choice(targets)
        start = target
        while start > 0 and before[target] - before[start - 1] <= length:
            start -= 1
        return Sample(
            id="",
            context=INSTRUCTION + "".join(lines[start:target]),
            question=QUESTION,
            answers=[lines[target].strip()],
            max_new_tokens=self.max_new_tokens,
            chat=False,
            meta={"length": length, "docs": [doc_id], "line": target + 1},
        )

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        line = first_code_line(prediction).strip()
        target = sample.answers[0]
        return {"edit_sim": edit_similarity(line, target), "exact_match": float(line == target)}
