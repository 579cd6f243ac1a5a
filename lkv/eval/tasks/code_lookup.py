"""Value lookup in real held-out code: which value does a held-out standard-library module assign to a name?

Next-line completion (:mod:`lkv.eval.tasks.code`) is beyond a 135M model even with the full cache (FullKV
edit similarity ≈ 0.16, exact match 0 of 6 at 1K tokens; see the class docstring), so its eviction
differences are noise. This task keeps real held-out code but asks for something the context decides: the
number assigned to a name (``_MAXLINE = 65536`` → "What value does the code assign to `_MAXLINE`?"). The
assignment sits at a chosen depth of a ``length``-token window of the module; the name is assigned exactly
once in that window. The answer opens with a backtick and ``NAME = `` and stops at a backtick or newline; the score is an
exact match of what follows with the literal.

The question wording is used by no training prompt (whose code families explain, document, list or quote
code, :mod:`lkv.labels.instructions`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.text import draw_module, heldout_code, module_lines, rng_for
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# NAME = number of 2+ digits, then an optional comment (0, 1 and -1 are too easy to guess to tell retrieval
# from luck). String literals were tried too: with the full cache SmolLM2-135M copied 3 of 3 numbers but
# only 1 of 3 strings, so strings measure the model rather than the cache.
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]{2,})\s*=\s*(-?\d[\d_.xXa-fA-F]+)\s*(?:#.*)?$")
_ANY_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(?:[-+*/|&]?=)(?!=)")
QUESTIONS = (
    "In the code above, what value is assigned to `{name}`? Answer with the value only.",
    "What does the code set `{name}` to? Reply with the literal value.",
)
# The answer opens with the assignment, so the model completes the line it has seen (RULER-style prefix).
ANSWER_PREFIX = "`{name} = "


class CodeLookupTask(GeneratedTask):
    """Literal lookup in held-out standard-library modules.

    Measured with the full cache on SmolLM2-135M (``OMP_NUM_THREADS=1``, question-aware, 1K tokens; see
    the report of issue 16): FullKV answers most samples, where next-line completion scores edit
    similarity 0.16 and exact match 0.

    Args:
        lengths: context sizes in tokens.
        depths: share of the window's tokens before the assignment.
        samples_per_cell: samples per (length, depth), each from a randomly drawn module and assignment.
        max_new_tokens: answer length (the number and a closing backtick).
        seed: base seed.
        stdlib_dir: Python source tree (default: the running interpreter's standard library).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    name = "code_lookup"
    metric = "exact_match"

    def __init__(
        self,
        lengths: tuple[int, ...] = (1024,),
        depths: tuple[float, ...] = (0.1, 0.5, 0.9),
        samples_per_cell: int = 1,
        max_new_tokens: int = 24,
        seed: int = 0,
        stdlib_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        super().__init__(
            lengths, seed, heldout_fraction, max_new_tokens, depths, samples_per_cell=samples_per_cell
        )
        self.stdlib_dir = stdlib_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        files = heldout_code(self.stdlib_dir, self.heldout_fraction)
        out = []
        for length in self.lengths:
            for depth in self.depths:
                for index in range(self.samples_per_cell):
                    rng = rng_for("code_lookup", self.seed, length, depth, index)
                    sample = draw_module(files, rng, 100, self._sample, tokenizer, length, depth, rng)
                    if sample is None:
                        raise ValueError(
                            f"no held-out module with a lookup target at {length} tokens in 100 draws"
                        )
                    sample.id = f"code_lookup-L{length}-d{depth:g}-s{self.seed}-{index}"
                    out.append(sample)
        return out

    def _sample(self, doc_id: str, path: Path, tokenizer, length: int, depth: float, rng) -> Sample | None:
        module = module_lines(tokenizer, path, length)
        if module is None:
            return None
        _, lines, counts = module
        targets = [i for i, line in enumerate(lines) if _ASSIGNMENT.match(line)]
        rng.shuffle(targets)
        for target in targets[:20]:
            # Lines before the target worth depth × length tokens, after it the rest.
            start, before = target, 0
            while start > 0 and before + counts[start - 1] <= depth * length:
                start -= 1
                before += counts[start]
            stop, total = target + 1, before + counts[target]
            while stop < len(lines) and total + counts[stop] <= length:
                total += counts[stop]
                stop += 1
            if total < 0.9 * length:
                continue  # the module ends too early for this window
            window = lines[start:stop]
            name, value = _ASSIGNMENT.match(lines[target]).groups()
            assigned = [m.group(1) for m in map(_ANY_ASSIGNMENT.match, window) if m]
            if assigned.count(name) != 1:
                continue  # reassigned in the window: the answer would be ambiguous
            return Sample(
                id="",
                context="```python\n" + "".join(window) + "```\n\n",
                question=rng.choice(QUESTIONS).format(name=name),
                answers=[value],
                max_new_tokens=self.max_new_tokens,
                answer_prefix=ANSWER_PREFIX.format(name=name),
                stop=("`", "\n"),
                meta={"length": length, "depth": depth, "docs": [doc_id], "line": target + 1},
            )
        return None

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        # The completed line's value (generation stops at a closing backtick or newline).
        return {"exact_match": float(prediction.strip().rstrip(";,") == sample.answers[0])}
