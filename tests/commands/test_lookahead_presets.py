"""`lkv generate --preset` and `lkv eval`'s `press_args: {lookaheadkv: {preset: ...}}` on an exported adapter folder
that holds its probe: the kept positions are those of the press built by hand from the primitives; unknown
press_args end each command with one error line before any model loads."""

import json
import re

import pytest
import torch

import lkv.commands.eval
import lkv.commands.eval_run
import lkv.commands.generate
import lkv.commands.generate_run
import lkv.eviction.compressor
import lkv.eviction.presses.lookaheadkv
from lkv.cli import main as lkv_main
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import LookaheadKVPress, ProbePress
from tests.conftest import ESSAYS, build_tiny_model, tiny_needle_task
from tests.eviction.conftest import build_press
from tests.eviction.test_lookahead_settings import recipe_sentences, recipe_union, write_folder

BUDGETS = (128, 256)  # below and at the long preset's sentence budget


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An adapter folder of the tiny Llama with its probe in ``probe/`` (no preset recorded); every model load
    gives a fresh tiny Llama."""
    model, _ = build_tiny_model("llama")
    module, probe = build_press("lookaheadkv", model).adapter, build_press("probe", model)
    monkeypatch.setattr(lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model())
    return write_folder(tmp_path / "adapter", module, probe)


def reference_kept(folder, ids: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """What today's six-flag long recipe keeps of ``ids`` at ``budget``: built from the primitives on a fresh
    model, the sentence share only from C = 256 on (the C = 128 runs used the union alone)."""
    model, tokenizer = build_tiny_model()
    module = LookaheadKVPress.from_folder(folder, model).adapter
    probe = ProbePress.from_folder(folder / "probe", model)
    press = recipe_union(module, probe) if budget < 256 else recipe_sentences(module, probe, tokenizer)
    return Compressor(model, tokenizer, press, budget).compress(ids).kept


def record_evictions(monkeypatch) -> list[tuple[Compressor, torch.Tensor, int, list[torch.Tensor]]]:
    """Every eviction a Compressor makes, as ``(compressor, prompt ids, budget, kept)``."""
    made, evict = [], Compressor.evict

    def recording(self, scored, budget=None, in_place=False):
        out = evict(self, scored, budget, in_place)
        made.append((self, scored.ids.clone(), out.budget.tokens(scored.prompt_len), out.kept))
        return out

    monkeypatch.setattr(lkv.eviction.compressor.Compressor, "evict", recording)
    return made


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_generate_with_the_long_preset_keeps_what_the_recipe_kept(folder, monkeypatch, capsys):
    made = record_evictions(monkeypatch)
    prompt = " ".join(ESSAYS.values())[:1700]  # ~1.4K tokens: over 1024, so the recipe's sentences count
    for budget in BUDGETS:
        args = [
            "--method",
            "lookaheadkv",
            "--adapter",
            str(folder),
            "--preset",
            "long",
            "--max_new_tokens",
            "1",
        ]
        lkv_main(["generate", "--prompt", prompt, "--budget", str(budget), *args])
    assert [b for _, _, b, _ in made] == list(BUDGETS)
    for _, ids, budget, kept in list(made):  # the references' own evictions are recorded too
        assert ids.shape[1] > 1024
        assert same(kept, reference_kept(folder, ids, budget)), budget
    # press_args reach lookaheadkv too, with the same keys
    made.clear()
    lkv_main(
        ["generate", "--prompt", prompt, *args[:4], "--press_args", '{"preset": "paper"}', "--budget", "64"]
    )
    ((compressor, _, _, _),) = made
    assert isinstance(compressor.press, LookaheadKVPress) and compressor.press.kernel == 1


def test_eval_with_the_long_preset_keeps_what_the_recipe_kept(folder, tiny_corpus, tmp_path, monkeypatch):
    """One scoring of each prompt serves both budgets: the sentence share applies at the one it starts at."""
    made = record_evictions(monkeypatch)
    lkv.commands.eval.evaluate(
        [tiny_needle_task(tiny_corpus, lengths=(1400,), max_new_tokens=1)],
        methods=("lookaheadkv",),
        budgets=BUDGETS,
        settings=("aware",),
        adapter=str(folder),
        press_args={"lookaheadkv": {"preset": "long"}},
        output=str(tmp_path / "out"),
        progress=False,
    )
    long = [(ids, budget, kept) for c, ids, budget, kept in made if c.press.name != "fullkv"]
    assert sorted(budget for _, budget, _ in long) == list(BUDGETS)
    for ids, budget, kept in long:
        assert ids.shape[1] > 1024
        assert same(kept, reference_kept(folder, ids, budget)), budget
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["press_args"]["lookaheadkv"]
    assert recorded["sentences_from_budget"] == 256 and recorded["fusion"] == "union"


def one_error(capsys, verb: str) -> str:
    message = capsys.readouterr().err
    errors = [line for line in message.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"lkv {verb}: error: "), message
    return errors[0]


@pytest.fixture
def no_model(monkeypatch):
    """Every model loader of the commands raises: a test passes only if nothing was loaded."""

    def fail(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for module, name in [
        (lkv.commands.generate_run, "load_backbone"),
        (lkv.commands.generate_run, "load_lookahead"),
        (lkv.commands.eval_run, "load_backbone"),
        (lkv.commands.eval_run, "load_module"),
        (lkv.eviction.presses.lookaheadkv, "load_backbone"),
    ]:
        monkeypatch.setattr(module, name, fail)


def test_generate_refuses_an_unknown_press_arg_before_any_model_loads(no_model, capsys):
    with pytest.raises(SystemExit):
        lkv_main(["generate", "--method", "snapkv", "--prompt", "hi", "--press_args", '{"nonsense": 1}'])
    error = one_error(capsys, "generate")
    assert re.search(
        r"press_args for snapkv: unknown key nonsense; snapkv takes window, kernel, pooling$", error
    )


def test_eval_refuses_an_unknown_press_arg_before_any_model_loads(no_model, tmp_path, capsys):
    args = ["--tasks", "[]", "--methods", "[snapkv,tova]", "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        lkv_main(["eval", *args, "--press_args", "{snapkv: {window: 4}, tova: {windw: 4}}"])
    assert re.search(
        r"press_args for tova: unknown key windw; tova takes ranking$", one_error(capsys, "eval")
    )
    assert not (tmp_path / "out").exists()


def test_the_long_preset_without_any_probe_is_refused_before_any_model_loads(no_model, tmp_path, capsys):
    model, _ = build_tiny_model("llama")
    plain = write_folder(tmp_path / "plain", build_press("lookaheadkv", model).adapter)
    with pytest.raises(SystemExit):
        lkv_main(
            [
                "generate",
                "--method",
                "lookaheadkv",
                "--adapter",
                str(plain),
                "--prompt",
                "hi",
                "--preset",
                "long",
            ]
        )
    assert re.search(
        r"--adapter .*plain: .*fuse the module with a probe .*give --probe", one_error(capsys, "generate")
    )


def test_generate_takes_every_settings_key_as_a_flag():
    import inspect

    from lkv.eviction.presses.lookahead_settings import KEYS

    assert set(KEYS) <= set(inspect.signature(lkv.commands.generate.generate).parameters)
