"""A development signal for generalisation: needles of many fact kinds in haystacks of many text sources.

Each sample draws a prompt length uniformly over ``[min_length, max_length]`` tokens, fills a haystack to it
with consecutive units (sentences or lines) of documents drawn from one source's ``dev`` (or ``heldout``)
split (:mod:`lkv.labels.sources`; never its ``train`` documents; a split holding fewer tokens gives all of
it), and plants one fact of a kind (:data:`KINDS`, keyed by a name of :data:`lkv.labels.facts.EVAL_KEYS`)
at a token position drawn uniformly over the haystack (moved to the nearest unit boundary). A *distractor*
kind plants a second fact of the same format with another key and value; the question asks
for the first. The prompt is the haystack, then the question, in one user turn; the score is RULER's
``string_match_all``.

Each row's ``meta`` records the source, its group (``in-source``: sources training may use;
``out-of-source``: :data:`lkv.labels.sources.HELDOUT_SOURCES`), the fact kind and its side
(:mod:`lkv.labels.facts`), the measured prompt length and the **measured distance**: the prompt tokens after
the token that holds the asked value's last character, counted on the tokenised prompt (:func:`value_distance`),
with its bin: ``far`` (≥ 1536), ``near`` (≤ 1024) or ``mid``.

Screening by FullKV (``screened_by``): a needle the full-cache model cannot retrieve measures the model, not
the eviction. The rule: run the task once with FullKV alone and ``oversample = k`` (``k × samples_per_source``
candidates per source); then give that run's folder as ``screened_by``: each source keeps its first
``samples_per_source`` candidates that FullKV answered right (:func:`lkv.eval.paired.fullkv_solved`, the
*solved* samples of the paired comparisons), in candidate order. Sample ids depend only on the source, split,
kind, seed and candidate index, so the screened samples are exactly the screening run's prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lkv.core.chat import chat_parts
from lkv.eval.paired import solved_in
from lkv.eval.results import check_same_samples
from lkv.eval.tasks.base import GeneratedTask, Sample, encode_sample
from lkv.eval.tasks.metrics import string_match_all
from lkv.eval.tasks.text import SplitUnits, insert_at_depths, rng_for, source_haystack
from lkv.labels.facts import EVAL_KEYS, distinct_values, fact_format
from lkv.labels.prompts import DEFAULT_HELDOUT_FRACTION
from lkv.labels.sources import (
    BUILTIN_SOURCES,
    SOURCES,
    evaluation_split,
    known_sources,
    make_source,
    source_roots,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FAR = 1536  # measured distance (tokens) from which a needle counts as far
NEAR = 1024  # ... up to which it counts as near


@dataclass(frozen=True)
class NeedleKind:
    """A fact kind of this task: a fact format (:mod:`lkv.labels.facts`) and how many distractors (facts of
    the same format with other keys and values) sit beside the asked one."""

    name: str
    format: str
    distractors: int = 0


KINDS: dict[str, NeedleKind] = {
    k.name: k
    for k in (
        NeedleKind("serial_code", "serial_code"),
        NeedleKind("iso_date", "iso_date"),
        NeedleKind("measurement", "measurement"),
        NeedleKind("date", "date"),
        NeedleKind("contact_name", "contact_name"),
        NeedleKind("badge_code", "badge_code"),
        # a code beside a distractor of the same shape: two facts of one format with different keys
        NeedleKind("badge_code_pair", "badge_code", distractors=1),
        NeedleKind("magic_number", "magic_number"),  # the training fact, as the in-distribution anchor
    )
}
DEFAULT_KINDS = tuple(KINDS)


BINS = ("far", "mid", "near")


def distance_bin(distance: int) -> str:
    """``far`` (≥ :data:`FAR` tokens), ``near`` (≤ :data:`NEAR`) or ``mid``."""
    return "far" if distance >= FAR else "near" if distance <= NEAR else "mid"


def value_distance(sample: Sample, tokenizer: PreTrainedTokenizerBase, value: str) -> tuple[int, int]:
    """``(prompt_tokens, distance)``: the prompt's length as :func:`encode_sample` tokenises it (chat template
    rendered with ``enable_thinking`` off, ``lkv eval``'s default), and the number of its tokens after the
    one that holds ``value``'s last character (``value`` sits once in the context). The shortest prefix of
    the prompt whose text contains ``value`` is ``prompt_tokens - distance`` tokens long.

    Raises:
        ValueError: ``value`` is not in the context exactly once.
    """
    context_tokens, after = context_distance(sample, tokenizer, value)
    question_tokens = len(encode_sample(sample, tokenizer)[1])
    return context_tokens + question_tokens, after + question_tokens


def context_distance(sample: Sample, tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, int]:
    """``(context_tokens, distance)``: the context's length as :func:`encode_sample` tokenises it (chat
    template opening included, ``enable_thinking`` off) and the number of its tokens after the one that holds
    ``text``'s last character: how far back from the end of the context ``text`` sits.

    Raises:
        ValueError: ``text`` is not in the context exactly once.
    """
    if sample.context.count(text) != 1:
        raise ValueError(f"sample {sample.id}: {text!r} must occur once in the context")
    context_ids = encode_sample(sample, tokenizer)[0]
    prefix = chat_parts(tokenizer, False)[0] if sample.chat else ""
    encoded = tokenizer(
        prefix + sample.context, add_special_tokens=not sample.chat, return_offsets_mapping=True
    )
    if list(encoded["input_ids"]) != context_ids:
        raise ValueError(f"sample {sample.id}: the context tokenises differently with offsets")
    end = len(prefix) + sample.context.index(text) + len(text)  # one past the text's last character
    last = max(i for i, (start, stop) in enumerate(encoded["offset_mapping"]) if start < end and stop > start)
    return len(context_ids), len(context_ids) - (last + 1)


#: a source's group (:attr:`lkv.labels.sources.TextSource.group`) as its rows name it: ``out-of-source`` (no
#: training prompt uses it), ``user`` (the user's own documents) or ``in-source``
SOURCE_GROUPS = {"in": "in-source", "out": "out-of-source", "user": "user"}


class GeneraliseTask(GeneratedTask):
    """Needles of many kinds in haystacks of many text sources, at continuous lengths and measured distances.

    Samples: per source, ``samples_per_source × oversample`` candidates (the kinds in turn, from the
    source's place in :data:`lkv.labels.sources.SOURCES` on), or with ``screened_by`` the first
    ``samples_per_source`` of them that FullKV solved (fewer where FullKV solved fewer: rows count them).

    Args:
        sources: text sources (:data:`lkv.labels.sources.SOURCES`); default: every one this machine ships
            (``text-folder``, the user's own documents, needs its folder in ``roots``).
        kinds: fact kinds (:data:`KINDS`); default: all of them.
        split: the sources' documents to draw from: ``dev`` (the development signal) or ``heldout``.
        samples_per_source: samples per source.
        oversample: candidates per needed sample (``k`` of the screening rule).
        min_length: shortest prompt in tokens (lengths are drawn uniformly between the two).
        max_length: longest prompt in tokens.
        answer_slack: tokens generated beyond the asked value's own length.
        screened_by: an ``lkv eval`` folder (or its ``results.jsonl``) of this task with FullKV; keep only
            candidates FullKV answered right.
        bin_caps: with ``screened_by``, per source the first ``bin_caps[bin]`` FullKV-solved candidates of each
            named distance bin (``far`` / ``mid`` / ``near``) instead of the first ``samples_per_source``; bins
            not named are dropped. A pre-registered set fixes how many far and near needles it holds.
        screen_setting: the setting whose FullKV answers screen (``aware`` or ``agnostic``).
        seed: base seed.
        roots: source name → folder to read it from instead of its usual place (tests, other machines).
    """

    name = "generalise"
    metric = "string_match"
    settles_at_full_score = True  # string_match_all: a found value stays found

    def __init__(
        self,
        sources: tuple[str, ...] | None = None,
        kinds: tuple[str, ...] | None = None,
        split: Literal["dev", "heldout"] = "dev",
        samples_per_source: int = 8,
        oversample: int = 1,
        min_length: int = 1024,
        max_length: int = 7680,
        answer_slack: int = 16,
        screened_by: str | None = None,
        screen_setting: Literal["aware", "agnostic"] = "aware",
        seed: int = 0,
        roots: dict[str, str] | None = None,
        bin_caps: dict[str, int] | None = None,
    ) -> None:
        sources = known_sources(sources or BUILTIN_SOURCES, "sources")
        kinds = tuple(kinds or DEFAULT_KINDS)
        bad_kinds = [k for k in kinds if k not in KINDS]
        if bad_kinds or not kinds:
            raise ValueError(f"kinds: unknown fact kinds {bad_kinds}; choose from {', '.join(KINDS)}")
        if not 0 < min_length <= max_length:
            raise ValueError(f"need 0 < min_length ≤ max_length, got {min_length} and {max_length}")
        if answer_slack < 0:
            raise ValueError(f"answer_slack must be ≥ 0, got {answer_slack}")
        if bin_caps is not None:
            if screened_by is None:
                raise ValueError("bin_caps: caps solved candidates per distance bin; give screened_by too")
            bad = {b: n for b, n in bin_caps.items() if b not in BINS or not (isinstance(n, int) and n > 0)}
            if bad or not bin_caps:
                raise ValueError(
                    f"bin_caps: expected positive counts for bins among {', '.join(BINS)}, got {bin_caps}"
                )
        if screen_setting not in ("aware", "agnostic"):
            raise ValueError(f"screen_setting must be 'aware' or 'agnostic', got {screen_setting!r}")
        super().__init__(
            (min_length, max_length),
            seed,
            DEFAULT_HELDOUT_FRACTION,
            samples_per_source=samples_per_source,
            oversample=oversample,
        )
        self.sources = sources
        self.kinds = kinds
        self.split = evaluation_split(split)
        self.min_length = min_length
        self.max_length = max_length
        self.answer_slack = answer_slack
        self.screened_by = screened_by
        self.screen_setting = screen_setting
        self.bin_caps = dict(bin_caps) if bin_caps is not None else None
        self.roots = source_roots(roots)

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        solved: frozenset[str] | None = None
        screen_rows: list[dict[str, Any]] = []
        if self.screened_by is not None:
            cell = (self.name, self.screen_setting)
            _, screened, screen_rows = solved_in(self.screened_by, [cell], "screened_by")
            solved = screened[cell]
        out: list[Sample] = []
        for name in self.sources:
            documents = SplitUnits(make_source(name, self.roots.get(name)), self.split)
            candidates = [
                self._sample(documents, tokenizer, index)
                for index in range(self.samples_per_source * self.oversample)
            ]
            if solved is None:
                out.extend(candidates)
                continue
            # a screen row counts only for the prompt it was scored on (refused if this one differs)
            check_same_samples(
                {s.id: s.meta for s in candidates}, screen_rows, self.name, f"screened_by {self.screened_by}"
            )
            if self.bin_caps is None:
                out.extend([s for s in candidates if s.id in solved][: self.samples_per_source])
            else:
                taken = dict.fromkeys(self.bin_caps, 0)
                for sample in (s for s in candidates if s.id in solved):
                    group = sample.meta["bin"]
                    if group in taken and taken[group] < self.bin_caps[group]:
                        taken[group] += 1
                        out.append(sample)
        return out

    def _sample(self, documents: SplitUnits, tokenizer: PreTrainedTokenizerBase, index: int) -> Sample:
        source = documents.source
        # the kinds in turn, each source starting at its own place in the list: a few samples per source
        # still cover every kind across the sources
        kind = KINDS[self.kinds[(index + list(SOURCES).index(source.name)) % len(self.kinds)]]
        fmt = fact_format(kind.format)
        rng = rng_for(self.name, source.name, self.split, kind.name, self.seed, index)
        target = rng.randint(self.min_length, self.max_length)
        # the question and the chat template take ~40 tokens: the haystack fills the rest
        window = source_haystack(documents, tokenizer, max(1, target - 40), rng)
        if not window:
            raise ValueError(f"text source {source.name}: no text on its {self.split!r} split")
        text = "".join(u.text for u in window)
        keys = rng.sample(EVAL_KEYS, 1 + kind.distractors)
        values = distinct_values([fmt] * len(keys), rng)
        while any(v in text for v in values):  # a value must occur once in the prompt: its needle's
            values = distinct_values([fmt] * len(keys), rng)
        statements = [fmt.statement.format(key=k, value=v) for k, v in zip(keys, values, strict=True)]
        needles = [source.as_unit(s) for s in statements]
        depths = [rng.random() for _ in needles]
        body = insert_at_depths(window, needles, depths)
        context = source.join(body) + "\n\n"
        question = rng.choice(fmt.questions).format(key=keys[0])
        sample = Sample(
            id=f"{self.name}-{source.name}-{self.split}-{kind.name}-s{self.seed}-{index}",
            context=context,
            question=question,
            answers=values[:1],
        )
        answer_tokens = len(tokenizer(values[0], add_special_tokens=False)["input_ids"])
        sample.max_new_tokens = answer_tokens + self.answer_slack
        length, distance = value_distance(sample, tokenizer, values[0])
        sample.meta = {
            "source": source.name,
            "source_group": SOURCE_GROUPS[source.group],
            "source_kind": source.kind,
            "split": self.split,
            "kind": kind.name,
            "kind_side": fmt.side,
            "distractors": kind.distractors,
            "keys": keys,  # the asked fact's first, then the distractors'
            "values": values,
            "length": length,
            "target_length": target,
            "depth": round(depths[0], 4),
            "distance": distance,
            "bin": distance_bin(distance),
            "docs": sorted({u.doc_id for u in window}),
        }
        return sample

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        return {"string_match": string_match_all(prediction, sample.answers)}
