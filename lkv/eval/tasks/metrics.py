"""Task metrics on generated text: string match (RULER), token F1, ROUGE-L, edit similarity, LongBench's.

Every function takes a prediction and one reference (or a list of them where the metric is defined over
several) and returns a float in ``[0, 1]``. The LongBench functions reproduce the official scorer
(``LongBench/metrics.py``) exactly, including its quirks, so numbers are comparable with published tables;
the plain :func:`rouge_l` and :func:`edit_similarity` are the textbook definitions used by the other tasks.
Importance-ranking metrics (Recall@C, Kendall τ) live in :mod:`lkv.core.metrics`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


# ---------------------------------------------------------------------------------------------------------
# Building blocks


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of two sequences (O(len(a)·len(b)) time, O(len(b)) memory)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for item in a:
        diagonal = 0  # row[j - 1] of the previous row
        for j, other in enumerate(b, start=1):
            above = row[j]
            row[j] = diagonal + 1 if item == other else max(above, row[j - 1])
            diagonal = above
    return row[-1]


def normalize_answer(text: str) -> str:
    """SQuAD/LongBench normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: Sequence[str], reference: Sequence[str]) -> float:
    """F1 of the multiset overlap of two token lists."""
    same = sum((Counter(prediction) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(reference)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------------------------
# General task metrics


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 after :func:`normalize_answer` (= LongBench's ``qa_f1_score``)."""
    return _f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def answer_agreement(prediction: str, reference: str) -> float:
    """:func:`token_f1` of two answers, except that two answers with no words at all agree fully (1.0)."""
    if not normalize_answer(prediction) and not normalize_answer(reference):
        return 1.0
    return token_f1(prediction, reference)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 (β = 1) of the whitespace tokens of the normalised texts: ``2·LCS / (|pred| + |ref|)``."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    return 2 * lcs_length(pred, ref) / (len(pred) + len(ref))


def edit_similarity(prediction: str, reference: str) -> float:
    """Normalised indel similarity of two strings, ``1 − indel_distance / (|a| + |b|) = 2·LCS / (|a| + |b|)``.

    This is ``Levenshtein.ratio`` (and so ``fuzz.ratio / 100`` before rounding), the similarity LongBench's
    code tasks use. Two empty strings are identical (1.0).
    """
    if not prediction and not reference:
        return 1.0
    return 2 * lcs_length(prediction, reference) / (len(prediction) + len(reference))


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER: the share of references found (case-insensitive) in the prediction."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    text = prediction.lower()
    return sum(ref.lower() in text for ref in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER: 1 if any reference is found (case-insensitive) in the prediction, else 0."""
    text = prediction.lower()
    return float(any(ref.lower() in text for ref in references))


def first_code_line(prediction: str) -> str:
    """The first line of a completion that is not a comment or a Markdown fence (LongBench's rule)."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


# ---------------------------------------------------------------------------------------------------------
# LongBench's official metrics (signature: prediction, one ground truth, all_classes for classification)


def qa_f1_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    return token_f1(prediction, ground_truth)


def rouge_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """``Rouge().get_scores(pred, gt)["rouge-l"]["f"]`` of the ``rouge==1.0.1`` package LongBench uses.

    That is summary-level ROUGE-L over sentences split at ``.``, counting *distinct* words: the union of
    each reference sentence's LCS words with every prediction sentence, accumulated over reference
    sentences; ``m``/``n`` are the distinct words of reference/prediction. An empty side scores 0, as the
    scorer's ``except`` does.
    """
    hyp = _rouge_sentences(prediction)
    ref = _rouge_sentences(ground_truth)
    if not hyp or not ref:
        return 0.0
    m = len({w for s in ref for w in s})
    n = len({w for s in hyp for w in s})
    union: set[str] = set()
    overlap = 0
    for ref_sentence in ref:
        before = len(union)
        for hyp_sentence in hyp:
            union |= set(_lcs_words(ref_sentence, hyp_sentence))
        overlap += len(union) - before
    recall, precision = overlap / m, overlap / n
    return 2.0 * (precision * recall) / (precision + recall + 1e-8)


def _rouge_sentences(text: str) -> list[list[str]]:
    """``rouge`` 1.0.1's preprocessing: split at ``.``, drop empty pieces, collapse whitespace, split on spaces."""
    return [" ".join(piece.split()).split(" ") for piece in text.split(".") if len(piece) > 0]


def _lcs_words(x: list[str], y: list[str]) -> list[str]:
    """One LCS of ``x`` and ``y``, reconstructed with ``rouge``'s tie-breaking (prefer moving in ``y``)."""
    table = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i in range(1, len(x) + 1):
        for j in range(1, len(y) + 1):
            if x[i - 1] == y[j - 1]:
                table[i][j] = table[i - 1][j - 1] + 1
            else:
                table[i][j] = max(table[i - 1][j], table[i][j - 1])
    out: list[str] = []
    i, j = len(x), len(y)
    while i > 0 and j > 0:
        if x[i - 1] == y[j - 1]:
            out.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def classification_score(
    prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None
) -> float:
    """1/k when the true class is among the k class names found in the prediction, else 0 (LongBench).

    The official scorer removes names that are substrings of the true class while iterating over the same
    list, which skips the entry after each removal; that behaviour is kept so scores match.
    """
    if not all_classes:
        raise ValueError("classification_score needs the task's all_classes")
    matches = [name for name in all_classes if name in prediction]
    # `for term in matches: ... matches.remove(term)`: Python's list iterator walks indices, so after a
    # removal the next entry shifts onto the current index and is never looked at.
    index = 0
    while index < len(matches):
        term = matches[index]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
        index += 1
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def retrieval_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Share of the numbers in the prediction that equal the paragraph id in ``Paragraph N`` (LongBench)."""
    wanted = re.findall(r"Paragraph (\d+)", ground_truth)
    if not wanted:
        raise ValueError(f"retrieval ground truth must read 'Paragraph N', got {ground_truth!r}")
    numbers = re.findall(r"\d+", prediction)
    return sum(number == wanted[0] for number in numbers) / len(numbers) if numbers else 0.0


def count_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """Share of the numbers in the prediction that equal the true count (LongBench ``passage_count``)."""
    numbers = re.findall(r"\d+", prediction)
    return sum(number == str(ground_truth) for number in numbers) / len(numbers) if numbers else 0.0


def code_sim_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None = None) -> float:
    """``fuzz.ratio(first_code_line(pred), gt) / 100``: :func:`edit_similarity` rounded to whole percent.

    fuzzywuzzy returns 100 for equal strings and 0 when either string is empty.
    """
    line = first_code_line(prediction)
    if line == ground_truth:
        return 1.0
    if not line or not ground_truth:
        return 0.0
    return round(100 * edit_similarity(line, ground_truth)) / 100


LongBenchMetric = Callable[..., float]
LONGBENCH_METRICS: dict[str, LongBenchMetric] = {
    "qa_f1": qa_f1_score,
    "rouge": rouge_score,
    "classification": classification_score,
    "retrieval": retrieval_score,
    "count": count_score,
    "code_sim": code_sim_score,
}
