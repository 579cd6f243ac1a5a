"""The reach probe: needles at a fixed distance from the end, and the needle-token diagnostic (prefill only)."""

import pytest
import torch

from lkv.eval.runner import Evaluator
from lkv.eval.tasks import GeneraliseTask, NeedleFamilyTask, NeedleTokenTask, encode_sample
from lkv.eval.tasks.needle_tokens import held_in_oracle_heads, kept_share, share_metrics, value_positions
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import OraclePress, SnapKVPress, StreamingLLMPress

FRACTION = 0.5  # four tiny essays: beta and gamma held out


def needles(corpus, **kwargs) -> NeedleFamilyTask:
    settings = {"essays_dir": str(corpus[0]), "heldout_fraction": FRACTION, "families": ("magic_number",)}
    return NeedleFamilyTask(distribution="in", **{**settings, **kwargs})


def test_distances_put_the_needle_that_many_tokens_before_the_end(tiny_corpus, tiny_tokenizer):
    task = needles(tiny_corpus, lengths=(300, 600), distances=(40, 150, 400), samples_per_cell=2)
    samples = task.samples(tiny_tokenizer)
    # 400 is no shorter than 300: that cell is skipped, the others have two samples each
    assert sorted({(s.meta["length"], s.meta["distance"]) for s in samples}) == [
        (300, 40), (300, 150), (600, 40), (600, 150), (600, 400)
    ]  # fmt: skip
    assert len(samples) == 10 and len({s.id for s in samples}) == 10
    for sample in samples:
        statement = next(p for p in sample.context.split(". ") if sample.answers[0] in p)
        tail = sample.context[sample.context.index(statement) + len(statement) :]
        tokens_after = len(tiny_tokenizer(tail, add_special_tokens=False)["input_ids"])
        assert sample.meta["needle_distance"] == pytest.approx(tokens_after, abs=6)  # sentence joins
        # within half a sentence (the tiny essays' sentences are ≤ 40 tokens) of the asked distance
        assert abs(sample.meta["needle_distance"] - sample.meta["distance"]) <= 40
    with pytest.raises(ValueError, match="shorter than a length"):
        needles(tiny_corpus, lengths=(300,), distances=(300,))


def test_depth_samples_keep_their_ids(tiny_corpus, tiny_tokenizer):
    """Adding distances changed nothing for depth-placed needles (their ids and texts are reused by runs)."""
    sample = needles(tiny_corpus, lengths=(300,), depths=(0.5,)).samples(tiny_tokenizer)[0]
    assert sample.id == "needle_id-magic_number-essays-L300-d0.5-s0-0"
    assert "distance" not in sample.meta and sample.meta["depth"] == 0.5


def test_value_positions_spell_the_answer(tiny_corpus, tiny_tokenizer):
    for sample in needles(tiny_corpus, lengths=(300,), distances=(40, 150)).samples(tiny_tokenizer):
        context, _ = encode_sample(sample, tiny_tokenizer)
        positions = value_positions(sample, tiny_tokenizer)
        spelled = tiny_tokenizer.decode([context[p] for p in positions])
        assert sample.answers[0] in spelled and len(spelled) <= len(sample.answers[0]) + 8
        assert positions == list(range(positions[0], positions[-1] + 1))


def test_kept_share_counts_value_positions_per_head():
    kept = [torch.tensor([[[0, 3, 5], [1, 2, 4]]]), torch.tensor([[[3, 4, 6], [0, 1, 2]]])]
    share = kept_share(kept, [3, 4])
    torch.testing.assert_close(share, torch.tensor([[0.5, 0.5], [1.0, 0.0]]))
    assert share_metrics(share) == {"value_kept": 0.5, "heads_all": 0.25, "heads_any": 0.75}
    with pytest.raises(ValueError, match="no value positions"):
        kept_share(kept, [])


def test_held_in_oracle_heads_counts_only_the_heads_where_the_oracle_keeps_the_whole_value():
    oracle = [1.0, 0.5, 1.0, 0.0, 1.0]
    assert held_in_oracle_heads(oracle, [1.0, 1.0, 0.5, 1.0, 1.0]) == (2, 3)
    assert held_in_oracle_heads([0.5, 0.0], [1.0, 1.0]) == (0, 0)


def test_runner_rows_match_the_eviction_kept_sets(tiny_llama, tiny_corpus, tmp_path):
    """A row's per-head shares are those of the positions a real eviction keeps; a budget ≥ S keeps all."""
    model, tokenizer = tiny_llama
    task = NeedleTokenTask(needles(tiny_corpus, lengths=(200,), distances=(30, 120)))
    presses = {"snapkv": SnapKVPress(window=4), "streamingllm": StreamingLLMPress(), "oracle": OraclePress()}
    rows = Evaluator(model, tokenizer, presses, [16, 4096], ["aware"], tmp_path, progress=False).run([task])
    samples = task.samples(tokenizer)
    assert len(rows) == len(samples) * 3 * 2 and {r["task"] for r in rows} == {"needle_id_tokens"}
    for sample in samples:
        context, question = encode_sample(sample, tokenizer)
        positions = value_positions(sample, tokenizer)
        for method in ("snapkv", "streamingllm"):
            compressor = Compressor(model, tokenizer, presses[method])
            kept = compressor.evict(compressor.score(context + question), 16).kept
            row = next(
                r for r in rows if (r["sample"], r["method"], r["budget"]) == (sample.id, method, "16")
            )
            assert row["per_head"] == [round(v, 4) for v in kept_share(kept, positions).flatten().tolist()]
            assert row["value_tokens"] == len(positions) and row["fullkv_score"] in (0.0, 1.0)
        everything = [r for r in rows if r["sample"] == sample.id and r["budget"] == "4096"]
        assert {r["score"] for r in everything} == {1.0}
    # a rerun finds every row done
    again = Evaluator(model, tokenizer, presses, [16, 4096], ["aware"], tmp_path, progress=False)
    assert len(again.run([task])) == len(rows)


def test_generalise_needles_run_through_the_diagnostic(tiny_llama, source_roots, tmp_path):
    """Over a GeneraliseTask, each row scores the asked value's tokens (a distractor's value is not counted), and
    carries the needle's measured distance and source group for the per-cell tables."""
    model, tokenizer = tiny_llama
    needles = GeneraliseTask(
        sources=tuple(source_roots),
        kinds=("badge_code_pair", "contact_name"),
        samples_per_source=2,
        min_length=150,
        max_length=300,
        roots=source_roots,
    )
    task = NeedleTokenTask(needles)
    presses = {"snapkv": SnapKVPress(window=4), "oracle": OraclePress()}
    rows = Evaluator(model, tokenizer, presses, [16], ["aware"], tmp_path, progress=False).run([task])
    samples = task.samples(tokenizer)
    assert len(rows) == 2 * len(samples) and {r["task"] for r in rows} == {"generalise_tokens"}
    pair = next(s for s in samples if s.meta["kind"] == "badge_code_pair")
    positions = value_positions(pair, tokenizer)
    context, _ = encode_sample(pair, tokenizer)
    spelled = tokenizer.decode([context[p] for p in positions])
    assert pair.meta["values"][0] in spelled and pair.meta["values"][1] not in spelled
    for r in rows:
        assert r["meta"]["distance"] >= 0 and r["meta"]["source_group"] in ("in-source", "out-of-source")
        assert 0.0 <= r["score"] <= 1.0 and r["fullkv_score"] in (0.0, 1.0)
