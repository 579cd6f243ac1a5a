"""Task metrics against hand-computed values (each expected number is worked out in the comment beside it)."""

import pytest
import torch

from lkv.eval.tasks.importance import ImportanceTask
from lkv.eval.tasks.metrics import (
    answer_agreement,
    classification_score,
    code_sim_score,
    count_score,
    edit_similarity,
    first_code_line,
    lcs_length,
    normalize_answer,
    retrieval_score,
    rouge_l,
    rouge_score,
    string_match_all,
    string_match_part,
    token_f1,
)


def test_lcs_length():
    assert lcs_length("ABCBDAB", "BDCABA") == 4  # textbook example: BCBA
    assert lcs_length([], [1, 2]) == 0
    assert lcs_length("same", "same") == 4


def test_normalize_answer():
    assert normalize_answer("The  Cat, sat on A mat!") == "cat sat on mat"


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        # "cat sat on mat" vs "cat sat": 2 shared, P = 2/4, R = 2/2, F1 = 2·0.5·1/1.5
        ("The cat sat on the mat.", "a cat sat", 2 / 3),
        # multiset overlap: x×2 y×1 vs x×1 y×2 share one x and one y: P = R = 2/3
        ("x x y", "x y y", 2 / 3),
        ("completely different", "nothing shared", 0.0),
        ("Porto", "porto.", 1.0),
    ],
)
def test_token_f1(prediction, reference, expected):
    assert token_f1(prediction, reference) == pytest.approx(expected)


def test_answer_agreement_counts_two_empty_answers_as_equal():
    assert answer_agreement("", "...") == 1.0
    assert token_f1("", "...") == 0.0  # LongBench's qa_f1 gives 0 here
    assert answer_agreement("cat", "dog") == 0.0


def test_rouge_l():
    # "cat sat on mat" vs "cat is on mat" (articles dropped): LCS = cat on mat = 3, F1 = 2·3/(4+4)
    assert rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(0.75)
    assert rouge_l("x y z", "z y x") == pytest.approx(2 * 1 / 6)  # LCS of a reversal = 1
    assert rouge_l("", "") == 1.0
    assert rouge_l("", "words") == 0.0


def test_edit_similarity():
    # LCS(kitten, sitting) = "ittn" = 4: 2·4/(6+7) = Levenshtein.ratio's 0.6154
    assert edit_similarity("kitten", "sitting") == pytest.approx(8 / 13)
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("abc", "") == 0.0
    assert edit_similarity("", "") == 1.0


def test_string_match():
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert string_match_part("The numbers are 123 and 456.", ["789", "456"]) == 1.0
    assert string_match_part("nothing", ["789"]) == 0.0
    assert string_match_all("UUID ABC-def", ["abc-DEF"]) == 1.0  # case-insensitive
    with pytest.raises(ValueError, match="at least one"):
        string_match_all("x", [])


def test_first_code_line_skips_comments_and_fences():
    assert first_code_line("\n```python\n# note\nreturn x  \nmore") == "return x  "
    assert first_code_line("# only a comment") == ""


def test_code_sim_score():
    # first usable line "return x + 1" (12 chars) vs "return x+1" (10): LCS 10 → 2·10/22 = 0.909 → fuzz 91
    assert code_sim_score("\n# comment\nreturn x + 1\nfoo", "return x+1") == 0.91
    assert code_sim_score("return x", "return x") == 1.0
    assert code_sim_score("# nothing usable", "return x") == 0.0


def test_rouge_score_is_rouge_1_0_1_summary_level():
    # hyp sentences "the cat sat" / "a dog ran", ref "the cat ran": union LCS words {the, cat} ∪ {ran} = 3;
    # m = 3 distinct reference words, n = 6 distinct hypothesis words: R = 1, P = 0.5, F = 2/3
    assert rouge_score("the cat sat. a dog ran", "the cat ran") == pytest.approx(2 / 3, abs=1e-6)
    # distinct words: "ran ran ran" has n = 1, and LCS words {ran}: R = 1/3, P = 1 → F = 0.5
    assert rouge_score("ran ran ran", "the cat ran") == pytest.approx(0.5, abs=1e-6)
    assert rouge_score("", "the cat ran") == 0.0  # the official scorer's `except` branch


def test_classification_score():
    classes = ["Location", "Person"]
    assert classification_score("Person", "Person", all_classes=classes) == 1.0
    assert classification_score("Person or Location", "Person", all_classes=classes) == 0.5
    assert classification_score("Location", "Person", all_classes=classes) == 0.0
    # LongBench removes substrings of the truth while iterating the same list: "a" goes, "ab" is skipped
    # and stays, so 2 matches remain and the score is 1/2 (a filter without the quirk would give 1).
    assert classification_score("abc", "abc", all_classes=["a", "ab", "abc"]) == 0.5
    with pytest.raises(ValueError, match="all_classes"):
        classification_score("x", "x")


def test_retrieval_and_count_scores():
    assert retrieval_score("Paragraph 3, or maybe paragraph 7", "Paragraph 3") == 0.5  # numbers 3, 7
    assert retrieval_score("no idea", "Paragraph 3") == 0.0
    assert count_score("There are 5 unique, not 6", "5") == 0.5
    assert count_score("5", 5) == 1.0
    with pytest.raises(ValueError, match="Paragraph N"):
        retrieval_score("3", "the third one")


def test_recall_at_c_and_kendall_tau():
    task = ImportanceTask("unused", budgets=(1, 2))
    target = torch.tensor([[[0.4, 0.1, 0.3, 0.2]]])
    scores = torch.tensor([[[0.4, 0.3, 0.2, 0.1]]])
    out = task.score(scores, target)
    # top-2 of scores {0, 1} vs of target {0, 2}: one shared → 0.5; top-1 both {0} → 1
    assert out["recall@2"] == pytest.approx(0.5)
    assert out["recall@1"] == pytest.approx(1.0)
    # pairs (0,1) (0,2) (0,3) (2,3) concordant, (1,2) (1,3) discordant: τ = (4 − 2)/6
    assert out["kendall_tau"] == pytest.approx(1 / 3)
    reversed_scores = torch.tensor([[[1.0, 4.0, 2.0, 3.0]]])  # exactly the reverse order of the target
    assert task.score(reversed_scores, target)["kendall_tau"] == pytest.approx(-1.0)
    assert task.score(reversed_scores, target)["recall@2"] == 0.0
    with pytest.raises(ValueError, match="shape"):
        task.score(scores[..., :3], target)
