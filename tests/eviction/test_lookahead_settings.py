"""LookaheadKV's settings value, its presets and the one factory: each preset keeps exactly the positions of the
press it names built from the primitives (LookaheadKVPress, FusedPress, SentencePress), at every budget."""

import dataclasses

import pytest
import torch

from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FusedPress, LookaheadKVPress
from lkv.eviction.presses.lookahead_settings import (
    KEYS,
    PRESETS,
    LookaheadKVSettings,
    Pooling,
    ProbeFusion,
    SentenceShare,
)
from lkv.eviction.presses.lookaheadkv import load_lookahead, lookahead_press
from lkv.eviction.presses.sentences import SentencePress, sentence_ends
from tests.eviction.conftest import build_press

# the long-prompt recipe as `lkv eval` configs spelled it before presets (six flat keys)
SIX_FLAGS = {
    "kernel": 7,
    "probe_weight": 0.5,
    "fusion": "union",
    "sentences": 0.5,
    "sentences_beyond": 1024,
    "sentences_scaled": True,
}
LONG_PROMPT = 1400  # longer than the recipe's 1024 single tokens at the end, so its sentences count


def long_prompt(tokenizer, seed: int = 0) -> torch.Tensor:
    """``(1, LONG_PROMPT)`` random ids of ``tokenizer``'s vocabulary (its sentence ends included)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(tokenizer), (1, LONG_PROMPT), generator=generator)


def recipe_union(module, probe) -> FusedPress:
    """The recipe's ranking as it was built by hand: the module max-pooled over 7, union with the probe."""
    return FusedPress([LookaheadKVPress(module, kernel=7), probe], [0.5, 0.5], rule="union")


def recipe_sentences(module, probe, tokenizer) -> SentencePress:
    """The recipe at C ≥ 256: the union plus half of the budget to sentences, beyond 1024, scaled."""
    return SentencePress(recipe_union(module, probe), sentence_ends(tokenizer), 0.5, 1024, scaled=True)


def kept(press, model, tokenizer, ids, budget: int, streamed: bool = False) -> list[torch.Tensor]:
    return Compressor(model, tokenizer, press, budget, streamed=streamed).compress(ids).kept


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_long_preset_keeps_what_the_six_flag_recipe_kept_below_and_above_its_sentence_budget(tiny_llama):
    """Below C = 256 the union alone (as the recipe was run at C = 128), from it on the union with sentences;
    two-phase, layer-streamed, and one scoring evicted to both budgets (as `lkv eval` and sweeps do)."""
    model, tokenizer = tiny_llama
    module, probe = build_press("lookaheadkv", model).adapter, build_press("probe", model)
    ids = long_prompt(tokenizer)
    long = lookahead_press(module, probe, "long", tokenizer)
    references = {128: recipe_union(module, probe), 256: recipe_sentences(module, probe, tokenizer)}
    sweep = Compressor(model, tokenizer, long, 128)
    scored = sweep.score(ids)
    for budget, reference in references.items():
        want = kept(reference, model, tokenizer, ids, budget)
        assert same(kept(long, model, tokenizer, ids, budget), want), budget
        assert same(kept(long, model, tokenizer, ids, budget, streamed=True), want), budget
        assert same(sweep.evict(scored, budget).kept, want), budget
    # the gate shows on this prompt: the sentences change what C = 128 and C = 256 keep
    for budget in references:
        assert not same(*(kept(r, model, tokenizer, ids, budget) for r in references.values())), budget
    # the six flat keys give the recipe with sentences at every budget, as they did
    six = lookahead_press(module, probe, SIX_FLAGS, tokenizer)
    assert same(kept(six, model, tokenizer, ids, 128), kept(references[256], model, tokenizer, ids, 128))


def test_paper_is_the_unpooled_module_and_pooled_the_default_press(tiny_llama):
    model, tokenizer = tiny_llama
    module = build_press("lookaheadkv", model).adapter
    ids = long_prompt(tokenizer)[:, :64]
    paper, pooled = lookahead_press(module, None, "paper"), lookahead_press(module, None, "pooled")
    assert same(
        kept(paper, model, tokenizer, ids, 16),
        kept(LookaheadKVPress(module, kernel=1), model, tokenizer, ids, 16),
    )
    assert same(
        kept(pooled, model, tokenizer, ids, 16), kept(LookaheadKVPress(module), model, tokenizer, ids, 16)
    )
    assert (pooled.kernel, pooled.pooling) == (7, "max") and lookahead_press(module).kernel == 7
    assert not same(kept(paper, model, tokenizer, ids, 16), kept(pooled, model, tokenizer, ids, 16))


def test_a_value_is_a_preset_a_preset_with_overrides_or_flat_keys():
    long = PRESETS["long"]
    assert LookaheadKVSettings.of("long") == LookaheadKVSettings.of({"preset": "long"}) == long
    assert long.sentences.from_budget == 256 and long.probe == ProbeFusion(0.5, "union")
    assert LookaheadKVSettings.of({"preset": "long", "kernel": 5}) == dataclasses.replace(
        long, pooling=Pooling(5)
    )
    assert LookaheadKVSettings.of({"kernel": 1}) == PRESETS["paper"]
    assert LookaheadKVSettings.of(None) == LookaheadKVSettings.of({}) == PRESETS["pooled"]
    assert LookaheadKVSettings.of({}, default="long") == long
    assert LookaheadKVSettings.of({"preset": "paper"}, default="long") == PRESETS["paper"]
    # the six flat keys: the recipe's fields with the share at every budget
    six = dataclasses.replace(long, sentences=SentenceShare(0.5, 1024, True))
    assert LookaheadKVSettings.of(SIX_FLAGS) == six
    # switching a part off drops the preset's other keys of that part
    assert LookaheadKVSettings.of({"preset": "long", "probe_weight": 0}).probe is None
    assert LookaheadKVSettings.of({"preset": "long", "sentences": 0}).sentences is None
    assert LookaheadKVSettings.of(long) is long
    with pytest.raises(dataclasses.FrozenInstanceError):
        long.probe = None


def test_the_record_is_the_flat_keys_today_s_runs_recorded():
    """run.json's record of a lookahead module: unchanged for the settings that existed before presets."""
    assert PRESETS["pooled"].record() == {"kernel": 7}
    assert LookaheadKVSettings.of({"probe_weight": 0.5}).record() == {"kernel": 7, "probe_weight": 0.5}
    assert LookaheadKVSettings.of(SIX_FLAGS).record() == SIX_FLAGS
    assert PRESETS["long"].record() == {**SIX_FLAGS, "sentences_from_budget": 256}
    assert LookaheadKVSettings.of(PRESETS["long"].flat()) == PRESETS["long"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            {"kernal": 7},
            r"unknown LookaheadKV setting kernal; it takes preset, kernel, pooling, probe_weight",
        ),
        ("lnog", r"unknown LookaheadKV preset 'lnog'; choose one of paper, pooled, long"),
        (3, r"expected a preset name \(paper, pooled, long\) or a mapping"),
        ({"kernel": 4}, r"kernel must be an odd whole number ≥ 1, got 4"),
        ({"kernel": 7.0}, r"kernel must be an odd whole number ≥ 1, got 7.0"),
        ({"pooling": "min"}, r"pooling must be one of max, avg"),
        ({"probe_weight": 1.5}, r"probe_weight must be a number in \(0, 1\]"),
        ({"probe_weight": 0.5, "fusion": "max"}, r"fusion: fusion rule must be one of mixture, union"),
        ({"fusion": "union"}, r"fusion given without probe_weight > 0"),
        ({"sentences": 1.5}, r"sentences must be a share of the budget in \(0, 1\]"),
        ({"sentences_from_budget": 256}, r"sentences_from_budget given without sentences > 0"),
        ({"sentences": 0.5, "sentences_from_budget": -1}, r"sentences_from_budget must be a whole number"),
        ({"sentences": 0.5, "sentences_scaled": True}, r"sentences_scaled scales the share"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(value, said):
    with pytest.raises(ValueError, match=said):
        LookaheadKVSettings.of(value)
    assert KEYS[0] == "preset"


def test_the_factory_refuses_a_fusion_without_a_probe_and_sentences_without_a_tokenizer(tiny_llama):
    model, _ = tiny_llama
    module = build_press("lookaheadkv", model).adapter
    with pytest.raises(
        ValueError, match="probe_weight 0.5: a lookahead module fused with a probe needs a probe"
    ):
        lookahead_press(module, None, "long")
    with pytest.raises(ValueError, match="give the tokenizer"):
        lookahead_press(module, build_press("probe", model), "long")


def test_a_folder_brings_its_probe_and_preset(tiny_llama, tmp_path, monkeypatch):
    """An exported folder with ``probe/`` and ``extra.preset``: loaded alone it is the long recipe with its own
    probe; a preset the user names wins; a folder without a preset is ``pooled``."""
    import lkv.eviction.presses.lookaheadkv
    from tests.conftest import build_tiny_model

    model, tokenizer = tiny_llama
    module, probe = build_press("lookaheadkv", model).adapter, build_press("probe", model)
    folder = write_folder(tmp_path / "long", module, probe, preset="long")
    monkeypatch.setattr(lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model())
    ids = long_prompt(tokenizer)
    net, tok, press = load_lookahead(folder)
    for budget, reference in [(128, recipe_union), (256, None)]:
        want = recipe_sentences(module, probe, tokenizer) if reference is None else reference(module, probe)
        assert same(kept(press, net, tok, ids, budget), kept(want, model, tokenizer, ids, budget))
    assert isinstance(load_lookahead(folder, settings="paper")[2], LookaheadKVPress)
    plain = write_folder(tmp_path / "plain", module)
    alone = load_lookahead(plain)[2]
    assert isinstance(alone, LookaheadKVPress) and alone.kernel == 7
    with pytest.raises(
        ValueError, match=r"plain'.*fuse the module with a probe .*there is none: give --probe"
    ):
        load_lookahead(plain, settings="long")


def write_folder(folder, module, probe=None, preset: str | None = None):
    """An exported adapter folder of ``module``: ``probe/`` if given, ``extra.preset`` if given."""
    if preset is not None:
        module.config.extra["preset"] = preset
    module.save(folder)
    module.config.extra.pop("preset", None)
    if probe is not None:
        probe.probe.save(folder / "probe")
    return folder
