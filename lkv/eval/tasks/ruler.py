"""RULER-style synthetic tasks (Hsieh et al., 2024), implemented from the published task definitions.

Task names, templates, answer prefixes and scoring (``string_match_all``) follow RULER's
``synthetic.yaml``/``constants.py``: eight needle variants over essay, noise or needle haystacks with word,
number or UUID keys/values, variable tracking (``vt``), common-words extraction (``cwe``) and
frequent-words extraction (``fwe``). Differences, all to fit a small CPU model and the held-out data:
no in-context example is prepended, the haystack essays and word lists come from the held-out Paul Graham
essays (keys are two held-out words joined by a hyphen), and ``length`` counts the haystack's tokens,
not the whole prompt's.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.text import HeldoutEssays, Sentence, insert_at_depths, noise_haystack, rng_for
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

RulerName = Literal[
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
]

NIAH_INTRO = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards."
)
NIAH_NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_QUESTION = "What are all the special magic {kind} for {query} mentioned in the provided text?"
NIAH_ANSWER_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE_INTRO = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often."
)
CWE_QUESTION = "Question: What are the {num_cw} most common words in the above list?"
CWE_ANSWER_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
FWE_INTRO = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words."
)
FWE_QUESTION = (
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = (
    " Answer: According to the coded text above, the three most frequently appeared words are:"
)


@dataclass(frozen=True)
class NiahSpec:
    """One RULER needle variant: haystack, key/value types and needle counts."""

    haystack: Literal["essay", "noise", "needle"]
    keys: Literal["words", "uuids"]
    values: Literal["numbers", "uuids"]
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1


NIAH_VARIANTS: dict[str, NiahSpec] = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids"),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers"),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids"),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", num_keys=4, num_queries=4),
}
# RULER's tokens_to_generate, shortened where RULER's allowance is far above the answer's length.
DEFAULT_NEW_TOKENS = {"niah": 32, "vt": 30, "cwe": 64, "fwe": 32}


def niah_wording(spec_values: str, singular: bool) -> dict[str, str]:
    """RULER's singular rewrite: with one query and one value, "Some ... are" becomes "A ... is"."""
    kind = spec_values[:-1] if singular else spec_values
    intro = NIAH_INTRO.format(kind=kind)
    question = NIAH_QUESTION.format(kind=kind, query="{query}")
    prefix = NIAH_ANSWER_PREFIX.format(kind=kind, query="{query}")
    if singular:
        intro = intro.replace("Some", "A").replace(" are ", " is ")
        question = question.replace("are all", "is")
        prefix = prefix.replace(" are", " is")
    return {"kind": kind, "intro": intro, "question": question, "answer_prefix": prefix}


class RulerTask(GeneratedTask):
    """One RULER synthetic task at several haystack lengths.

    Args:
        task: RULER task name (``niah_single_1`` … ``niah_multiquery``, ``vt``, ``cwe``, ``fwe``).
        lengths: haystack sizes in tokens.
        num_samples: samples per length.
        max_new_tokens: answer length (default: :data:`DEFAULT_NEW_TOKENS` of the task family).
        num_hops: variable tracking: assignments after the first in each chain (RULER: 4).
        num_chains: variable tracking: chains, only the first is asked for (RULER: 1).
        num_cw: common words: how many words are frequent, and asked for (RULER: 10).
        freq_cw: common words: occurrences of each frequent word (RULER: 30).
        freq_ucw: common words: occurrences of every other word (RULER: 3).
        alpha: Zipf exponent of frequent-words extraction (RULER: 2.0).
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    metric = "string_match"
    settles_at_full_score = True  # string_match_all: a found value stays found

    def __init__(
        self,
        task: RulerName = "niah_single_2",
        lengths: tuple[int, ...] = (1024,),
        num_samples: int = 4,
        max_new_tokens: int | None = None,
        num_hops: int = 4,
        num_chains: int = 1,
        num_cw: int = 10,
        freq_cw: int = 30,
        freq_ucw: int = 3,
        alpha: float = 2.0,
        seed: int = 0,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        if task not in NIAH_VARIANTS and task not in ("vt", "cwe", "fwe"):
            raise ValueError(f"unknown RULER task {task!r}; choose one of {', '.join(RulerName.__args__)}")
        family = "niah" if task in NIAH_VARIANTS else task
        super().__init__(
            lengths,
            seed,
            heldout_fraction,
            max_new_tokens or DEFAULT_NEW_TOKENS[family],
            num_samples=num_samples,
        )
        self.name = task
        self.task = task
        self.num_hops, self.num_chains = num_hops, num_chains
        self.num_cw, self.freq_cw, self.freq_ucw, self.alpha = num_cw, freq_cw, freq_ucw, alpha
        self.essays_dir = essays_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        essays = HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction)
        build = {"vt": self._vt, "cwe": self._cwe, "fwe": self._fwe}.get(self.task, self._niah)
        out = []
        for length in self.lengths:
            for index in range(self.num_samples):
                sample = build(
                    tokenizer, essays, length, rng_for("ruler", self.task, self.seed, length, index)
                )
                sample.id = f"{self.task}-L{length}-s{self.seed}-{index}"
                sample.max_new_tokens = self.max_new_tokens
                sample.meta["length"] = length
                out.append(sample)
        return out

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}

    # --- needles ------------------------------------------------------------------------------------------

    def _niah(self, tokenizer, essays: HeldoutEssays, length: int, rng) -> Sample:
        spec = NIAH_VARIANTS[self.task]

        def key() -> str:
            if spec.keys == "uuids":
                return str(uuid.UUID(int=rng.getrandbits(128)))
            return f"{rng.choice(essays.words)}-{rng.choice(essays.words)}"

        def value() -> str:
            if spec.values == "uuids":
                return str(uuid.UUID(int=rng.getrandbits(128)))
            return str(rng.randrange(1_000_000, 10_000_000))

        keys: list[str] = []
        while len(keys) < spec.num_keys:
            candidate = key()
            if candidate not in keys:
                keys.append(candidate)
        values = [[value() for _ in range(spec.num_values)] for _ in keys]
        wording = niah_wording(spec.values, singular=spec.num_queries * spec.num_values == 1)
        needles = [
            NIAH_NEEDLE.format(kind=spec.values, key=k, value=v)
            for k, vs in zip(keys, values, strict=True)
            for v in vs
        ]
        queried = sorted(rng.sample(range(spec.num_keys), spec.num_queries))
        queries = [keys[i] for i in queried]
        query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
        needle_tokens = sum(len(tokenizer(" " + n, add_special_tokens=False)["input_ids"]) for n in needles)
        budget = max(length - needle_tokens, 1)
        if spec.haystack == "essay":
            haystack = essays.take(budget, start=rng.randrange(len(essays.sentences)))
        elif spec.haystack == "noise":
            haystack = noise_haystack(tokenizer, budget)
        else:  # a haystack of distractor needles with other keys
            one = len(tokenizer(" " + needles[0], add_special_tokens=False)["input_ids"])
            haystack = [
                Sentence(NIAH_NEEDLE.format(kind=spec.values, key=key(), value=value()), "needle", one)
                for _ in range(max(budget // one, 1))
            ]
        depths = [rng.random() for _ in needles]
        body = insert_at_depths(haystack, needles, depths)
        return Sample(
            id="",
            context=f"{wording['intro']}\n{' '.join(body)}\n",
            question=wording["question"].format(query=query),
            answers=[v for i in queried for v in values[i]],
            answer_prefix=wording["answer_prefix"].format(query=query),
            meta={"docs": sorted({s.doc_id for s in haystack}), "depths": [round(d, 3) for d in depths]},
        )

    # --- variable tracking --------------------------------------------------------------------------------

    def _vt(self, tokenizer, essays: HeldoutEssays, length: int, rng) -> Sample:
        chains, names = variable_chains(rng, self.num_chains, self.num_hops)
        chain_tokens = sum(
            len(tokenizer(" " + line, add_special_tokens=False)["input_ids"]) for ch in chains for line in ch
        )
        haystack = noise_haystack(tokenizer, max(length - chain_tokens, 1))
        # Each chain's assignments go in order at random depths.
        needles, depths = [], []
        for lines in chains:
            needles += lines
            depths += sorted(rng.random() for _ in lines)
        body = insert_at_depths(haystack, needles, depths)
        query = chains[0][0].rsplit("= ", 1)[1]
        return Sample(
            id="",
            context=f"{VT_INTRO}\n\n{' '.join(body)}\n",
            question=VT_QUESTION.format(query=query),
            answers=names[: self.num_hops + 1],
            answer_prefix=VT_ANSWER_PREFIX.format(num_v=self.num_hops + 1, query=query),
        )

    # --- word extraction ----------------------------------------------------------------------------------

    def _cwe(self, tokenizer, essays: HeldoutEssays, length: int, rng) -> Sample:
        words = rng.sample(essays.words, len(essays.words))
        common, pool = words[: self.num_cw], words[self.num_cw :]

        def context(num_uncommon: int) -> str:
            listing = common * self.freq_cw + pool[:num_uncommon] * self.freq_ucw
            rng_for("cwe-order", self.seed, length, num_uncommon, common[0]).shuffle(listing)
            return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listing))

        num_uncommon = _largest_fitting(tokenizer, context, length, upper=len(pool))
        if num_uncommon is None:
            raise ValueError(
                f"cwe: {self.num_cw} common words × {self.freq_cw} do not fit {length} tokens; "
                "lower freq_cw or num_cw, or raise the length"
            )
        return Sample(
            id="",
            context=f"{CWE_INTRO}\n{context(num_uncommon)}\n",
            question=CWE_QUESTION.format(num_cw=self.num_cw),
            answers=common,
            answer_prefix=CWE_ANSWER_PREFIX.format(num_cw=self.num_cw),
        )

    def _fwe(self, tokenizer, essays: HeldoutEssays, length: int, rng) -> Sample:
        vocab: dict[str, None] = {}  # insertion-ordered set
        while len(vocab) < 2000:
            vocab["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))] = None
        vocab = list(vocab)
        vocab[0] = "...."  # the most frequent "word" is noise the question says to ignore (as in RULER)
        # ζ(α) by its partial sum plus the integral tail beyond 10^5 terms.
        zeta = sum(k**-self.alpha for k in range(1, 100_001)) + 100_000 ** (1 - self.alpha) / (self.alpha - 1)

        def context(num_words: int) -> str:
            counts = [int(num_words * k**-self.alpha / zeta) for k in range(1, len(vocab) + 1)]
            stream = [word for word, count in zip(vocab, counts, strict=True) for _ in range(count)]
            rng_for("fwe-order", self.seed, length, num_words).shuffle(stream)
            return " ".join(stream)

        num_words = _largest_fitting(tokenizer, context, length, upper=64 * length)
        if num_words is None:
            raise ValueError(f"fwe: no coded text fits {length} tokens")
        return Sample(
            id="",
            context=f"{FWE_INTRO} {context(num_words)}\n",
            question=FWE_QUESTION,
            answers=vocab[1:4],
            answer_prefix=FWE_ANSWER_PREFIX,
        )


def variable_chains(rng: random.Random, num_chains: int, num_hops: int) -> tuple[list[list[str]], list[str]]:
    """RULER's variable-tracking chains: ``(chains, names)``, each chain ``num_hops + 1`` assignment lines
    (``VAR ABCDE = 12345``, then ``VAR FGHIJ = VAR ABCDE``, ...) and every chain's distinct 5-letter variable
    names, chain by chain (the first chain's are ``names[: num_hops + 1]``)."""
    names: list[str] = []
    while len(names) < num_chains * (num_hops + 1):
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    chains = []
    for c in range(num_chains):
        chain_vars = names[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
        lines = [f"VAR {chain_vars[0]} = {rng.randrange(10_000, 100_000)}"]
        lines += [f"VAR {chain_vars[j + 1]} = VAR {chain_vars[j]}" for j in range(num_hops)]
        chains.append(lines)
    return chains, names


def _largest_fitting(tokenizer, build, length: int, upper: int) -> int | None:
    """Largest ``n`` in ``[0, upper]`` whose ``build(n)`` has at most ``length`` tokens (binary search)."""

    def fits(n: int) -> bool:
        return len(tokenizer(build(n), add_special_tokens=False)["input_ids"]) <= length

    if not fits(0):
        return None
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
