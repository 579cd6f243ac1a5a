"""experiments/generalise/why.py: a lost needle splits into value evicted / value kept, answer wrong."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[2] / "experiments/generalise"
sys.path.insert(0, str(STUDY))  # the script imports its sibling summary.py by name
spec = importlib.util.spec_from_file_location("generalise_why", STUDY / "why.py")
why = importlib.util.module_from_spec(spec)
spec.loader.exec_module(why)

META = {"source_group": "out-of-source", "bin": "far", "kind_side": "heldout"}


def answer(sample: str, method: str, budget: str, score: float) -> dict:
    return {"task": "generalise", "sample": sample, "method": method, "budget": budget, "setting": "aware",
            "score": score, "meta": META}  # fmt: skip


def tokens(sample: str, method: str, per_head: list[float]) -> dict:
    return {"task": "generalise_tokens", "sample": sample, "method": method, "budget": "128",
            "score": sum(per_head) / len(per_head), "per_head": per_head, "meta": META}  # fmt: skip


def test_losses_split_by_the_oracles_heads_holding_the_value():
    answers = [answer(s, "fullkv", "full", 1.0) for s in "abcde"] + [answer("f", "fullkv", "full", 0.0)]
    # a answered; b, c, d, e lost; f not FullKV-solved (its loss counts nowhere)
    answers += [answer("a", "lookaheadkv@mix", "128", 1.0)]
    answers += [answer(s, "lookaheadkv@mix", "128", 0.0) for s in "bcdef"]
    rows = [
        tokens("a", "oracle", [1.0, 1.0, 0.0]), tokens("a", "lookaheadkv", [1.0, 1.0, 0.0]),
        tokens("b", "oracle", [1.0, 1.0, 0.0]), tokens("b", "lookaheadkv", [1.0, 0.0, 1.0]),  # 1 of 2 held
        tokens("c", "oracle", [1.0, 0.5, 0.0]), tokens("c", "lookaheadkv", [1.0, 1.0, 1.0]),  # held: kept, wrong
        tokens("d", "oracle", [0.5, 0.5, 0.0]), tokens("d", "lookaheadkv", [0.0, 0.0, 0.0]),  # no Oracle head
        tokens("f", "oracle", [1.0, 1.0, 1.0]), tokens("f", "lookaheadkv", [0.0, 0.0, 0.0]),
    ]  # fmt: skip
    # e has no token rows: it is left out, not counted as answered or lost
    lines = why.why_lines(answers, rows, ["lookaheadkv@mix"])
    assert lines[0].startswith("FullKV solved 5 needles")
    assert "| out-of-source / far | lookaheadkv@mix | 128 | 4 | 1 | 3 | 1 | 1 | 1 | 0.58 | 0.54 |" in lines
    assert "| heldout | lookaheadkv@mix | 128 | 4 | 1 | 3 | 1 | 1 | 1 | 0.58 | 0.54 |" in lines
    strict = why.why_lines(answers, rows, ["lookaheadkv@mix"], held=0.4)
    assert "| heldout | lookaheadkv@mix | 128 | 4 | 1 | 3 | 0 | 2 | 1 | 0.58 | 0.54 |" in strict
    with pytest.raises(ValueError, match="the tokens folder has no generalise_tokens row"):
        why.why_lines(answers, [], ["lookaheadkv@mix"])


def test_value_profile_counts_the_heads_keeping_each_position():
    spec = importlib.util.spec_from_file_location("generalise_value_profile", STUDY / "value_profile.py")
    profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile)
    import torch

    # two layers, two KV heads; the second layer keeps fewer entries per head
    kept = [torch.tensor([[[0, 3, 5], [1, 3, 4]]]), torch.tensor([[[3, 6], [0, 1]]])]
    assert profile.kept_profile(kept, range(3, 7)) == [0.75, 0.25, 0.25, 0.25]
