"""Needle families in and out of the training distribution: other fact kinds, several needles, distractors,
other question wordings, and a haystack no training prompt uses.

A *family* fixes the fact formats (:mod:`lkv.labels.facts`), how many needles are hidden and how many of them
are asked for. A family is **in-distribution** when everything about it occurs in the built-in training
prompts: a ``train`` fact format asked with its own questions, one needle, keys from the training key
list, in (held-out) essay text. Everything else is **out-of-distribution**: ``eval`` fact formats (passphrases,
dates, names, letter codes, reworded questions), several needles, distractor needles with other keys, keys
drawn from the haystack's own words, and the ``pydoc`` haystack (the language reference's prose,
:func:`lkv.labels.sources.pydoc_prose`). A task holds one side only — ``needle_id`` or ``needle_ood`` —
so reports keep the two apart; each row's ``meta`` names its family, haystack and distribution.

The prompt is the haystack, then the question, in one user turn (as the training prompts put it, with no
answer prefix); the score is RULER's ``string_match_all`` over the asked values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lkv.eval.tasks.base import GeneratedTask, Sample
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.text import HeldoutEssays, PydocProse, SentenceCorpus, insert_at_depths, rng_for
from lkv.labels.facts import TRAIN_KEYS, distinct_values, fact_format, formats
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Distribution = Literal["in", "out"]
HAYSTACKS = ("essays", "pydoc")
_EVAL_KINDS = ("passphrase", "date", "name", "letter_code")
IN_FAMILIES = ("magic_number", "passcode", "vault_code")  # the formats of the default training mix


@dataclass(frozen=True)
class NeedleFamily:
    """How a family's needles are made.

    Attributes:
        name: the family (``meta["family"]`` of its rows).
        formats: fact formats a needle is drawn from.
        needles: needles hidden in the haystack.
        asked: how many of them the question asks for (the first ones).
        same_format: all needles share one format (distractors differ only in their key).
    """

    name: str
    formats: tuple[str, ...]
    needles: int = 1
    asked: int = 1
    same_format: bool = False

    @property
    def trained(self) -> bool:
        """Whether the training prompts contain this family's facts, questions and needle count."""
        return self.needles == 1 and all(fact_format(f).side == "train" for f in self.formats)


FAMILIES: dict[str, NeedleFamily] = {
    f.name: f
    for f in (
        *(NeedleFamily(fmt.name, (fmt.name,)) for fmt in formats("train")),
        *(NeedleFamily(name, (name,)) for name in _EVAL_KINDS),
        NeedleFamily("magic_number_reworded", ("magic_number_reworded",)),
        # Three facts of different kinds; one is asked for (RULER's multi-key needles, with kinds for keys).
        NeedleFamily("multi_needle", _EVAL_KINDS, needles=3, asked=1),
        # Three facts of one kind with different keys; only one is asked for.
        NeedleFamily("distractor", _EVAL_KINDS, needles=3, asked=1, same_format=True),
        # Eight facts of one trained kind with different keys; one is asked for. Every one of them looks like
        # what the training answers read, so with a budget too small for eight values only a method that
        # reads the question knows which to keep (not in OUT_FAMILIES: a study asks for it by name).
        NeedleFamily("trained_distractors", IN_FAMILIES, needles=8, asked=1, same_format=True),
    )
}
OUT_FAMILIES = (*_EVAL_KINDS, "magic_number_reworded", "multi_needle", "distractor")


class NeedleFamilyTask(GeneratedTask):
    """Needles of several families over held-out essays and/or the pydoc prose; one distribution per task.

    Samples: families × haystacks × lengths × depths × ``samples_per_cell``; each has its own keys, values
    and haystack window. The first needle sits at the grid depth, the others at random depths.

    Args:
        distribution: ``in`` (task ``needle_id``: trained families on essays) or ``out`` (``needle_ood``).
        families: family names (see :data:`FAMILIES`); default: :data:`IN_FAMILIES` or :data:`OUT_FAMILIES`.
        haystacks: ``essays`` and/or ``pydoc``; ``in`` allows only ``essays``. Default: ``essays`` for ``in``,
            both for ``out``.
        lengths: haystack sizes in tokens.
        depths: depth of the (first) needle, the share of the haystack's tokens before it.
        distances: instead of ``depths``, the (first) needle's distance from the end of the haystack in tokens
            (the tokens between the end of its sentence and the question), e.g. ``(250, 1000, 3000)``: the
            reach probe, where what matters is how far back the answer sits, not the prompt's length. A
            distance must be shorter than the length; cells where it is not are skipped. Rows record the
            nominal ``distance`` and the measured one (``needle_distance``) in ``meta``.
        samples_per_cell: samples per (family, haystack, length, depth or distance).
        answer_slack: tokens generated beyond the asked values' own length (room for "The passphrase
            for ... is"): decoding stops at the answer's length plus this.
        seed: base seed.
        essays_dir: essay folder (default: the cached embedded essays).
        heldout_fraction: the train/held-out split of the training prompts.
    """

    metric = "string_match"
    settles_at_full_score = True  # string_match_all: a found value stays found

    def __init__(
        self,
        distribution: Distribution = "out",
        families: tuple[str, ...] | None = None,
        haystacks: tuple[str, ...] | None = None,
        lengths: tuple[int, ...] = (1024, 2048),
        depths: tuple[float, ...] = (0.1, 0.5, 0.9),
        distances: tuple[int, ...] | None = None,
        samples_per_cell: int = 1,
        answer_slack: int = 16,
        seed: int = 0,
        essays_dir: str | None = None,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ) -> None:
        if distribution not in ("in", "out"):
            raise ValueError(f"distribution must be 'in' or 'out', got {distribution!r}")
        families = tuple(families or (IN_FAMILIES if distribution == "in" else OUT_FAMILIES))
        haystacks = tuple(haystacks or (("essays",) if distribution == "in" else HAYSTACKS))
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown needle families {unknown}; choose from {', '.join(FAMILIES)}")
        bad_haystacks = [h for h in haystacks if h not in HAYSTACKS]
        if bad_haystacks:
            raise ValueError(f"haystacks must be a non-empty subset of {HAYSTACKS}, got {haystacks}")
        if distribution == "in":
            untrained = [f for f in families if not FAMILIES[f].trained]
            if untrained or tuple(haystacks) != ("essays",):
                raise ValueError(
                    "distribution 'in' takes only trained families on the essays haystack; got families "
                    f"{untrained} that the training prompts do not contain, haystacks {tuple(haystacks)}"
                )
        if answer_slack < 0:
            raise ValueError(f"answer_slack must be ≥ 0, got {answer_slack}")
        if distances is not None:
            distances = tuple(distances)
            if not distances or min(distances) < 0:
                raise ValueError(f"distances must be a non-empty list of token counts ≥ 0, got {distances}")
            if not any(d < n for d in distances for n in lengths):
                raise ValueError(f"no distance in {distances} is shorter than a length in {tuple(lengths)}")
        super().__init__(lengths, seed, heldout_fraction, None, depths, samples_per_cell=samples_per_cell)
        self.name = "needle_id" if distribution == "in" else "needle_ood"
        self.distribution = distribution
        self.families = families
        self.haystacks = tuple(haystacks)
        self.answer_slack = answer_slack
        self.distances = distances
        self.essays_dir = essays_dir

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        corpora: dict[str, SentenceCorpus] = {}
        if "essays" in self.haystacks:
            corpora["essays"] = HeldoutEssays(tokenizer, self.essays_dir, self.heldout_fraction)
        if "pydoc" in self.haystacks:
            corpora["pydoc"] = PydocProse(tokenizer)
        out = []
        for family in self.families:
            for haystack in self.haystacks:
                for length in self.lengths:
                    for place in self._places(length):
                        for index in range(self.samples_per_cell):
                            sample = self._sample(
                                FAMILIES[family], haystack, corpora[haystack], length, place, index
                            )
                            answer_tokens = len(
                                tokenizer(" ".join(sample.answers), add_special_tokens=False)["input_ids"]
                            )
                            sample.max_new_tokens = answer_tokens + self.answer_slack
                            out.append(sample)
        return out

    def _places(self, length: int) -> list[float | int]:
        """Where the (first) needle goes in a haystack of ``length`` tokens: depths (floats), or distances from
        the end (ints) shorter than ``length``."""
        if self.distances is None:
            return list(self.depths)
        return [d for d in self.distances if d < length]

    def _sample(
        self,
        family: NeedleFamily,
        haystack: str,
        corpus: SentenceCorpus,
        length: int,
        place: float | int,
        index: int,
    ) -> Sample:
        """One sample; ``place`` is a depth (a float in [0, 1]) or, with ``distances``, a distance in tokens."""
        by_distance = self.distances is not None
        rng = rng_for(
            self.name, family.name, haystack, self.seed, length, f"D{place}" if by_distance else place, index
        )
        if family.same_format:
            chosen = [fact_format(rng.choice(family.formats))] * family.needles
        else:
            chosen = [fact_format(name) for name in rng.sample(family.formats, family.needles)]
        # In-distribution keys come from the training prompts' key list; others from the haystack's words.
        key_pool = TRAIN_KEYS if family.trained and self.distribution == "in" else corpus.words
        keys = rng.sample(key_pool, family.needles)
        values = distinct_values(chosen, rng)
        needles = [f.statement.format(key=k, value=v) for f, k, v in zip(chosen, keys, values, strict=True)]
        # the other needles' depths are drawn before the window, as they always were: a seed keeps its samples
        others = [rng.random() for _ in range(family.needles - 1)]
        window = corpus.take(length, start=rng.randrange(len(corpus.sentences)))
        total = sum(s.tokens for s in window)
        depth = min(1.0, max(0.0, 1.0 - place / total)) if by_distance else place
        depths = [depth, *others]
        body = insert_at_depths(window, needles, depths)
        # haystack tokens after the first needle's sentence (it sits at a sentence boundary; other needles
        # inserted after it are not counted)
        after = sum(1 for text in body[body.index(needles[0]) + 1 :] if text not in needles)
        distance = sum(s.tokens for s in window[len(window) - after :]) if after else 0
        questions = [rng.choice(f.questions).format(key=k) for f, k in zip(chosen, keys, strict=True)]
        asked = questions[: family.asked]
        question = (
            asked[0]
            if len(asked) == 1
            else "Answer each question. " + " ".join(f"{i}. {q}" for i, q in enumerate(asked, start=1))
        )
        where = f"D{place}" if by_distance else f"d{depth:g}"
        return Sample(
            id=f"{self.name}-{family.name}-{haystack}-L{length}-{where}-s{self.seed}-{index}",
            context=" ".join(body) + "\n\n",
            question=question,
            answers=values[: family.asked],
            meta={
                "family": family.name,
                "haystack": haystack,
                "distribution": "in-distribution" if self.distribution == "in" else "out-of-distribution",
                "formats": [f.name for f in chosen],
                "length": length,
                "depth": round(depth, 4),
                **({"distance": place} if by_distance else {}),
                "needle_distance": distance,
                "docs": sorted({s.doc_id for s in window}),
            },
        )

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}
