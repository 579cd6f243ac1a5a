"""`lkv eval`'s options are checked as one EvalSettings, named as the user writes them."""

import dataclasses
import inspect

import pytest

from lkv.commands.eval import evaluate
from lkv.commands.eval_settings import EvalSettings
from lkv.core.budget import Budget
from lkv.eval.results import fingerprint


def defaults(**changes) -> dict:
    """evaluate's defaults (its tasks aside) for FullKV and SnapKV (the default methods need an adapter and a
    probe), with ``changes``."""
    given = {k: p.default for k, p in inspect.signature(evaluate).parameters.items() if k != "tasks"}
    return {**given, "methods": ("fullkv", "snapkv"), **changes}


def test_the_fields_are_the_options_of_evaluate_but_its_tasks():
    options = [f.name for f in dataclasses.fields(EvalSettings) if f.init]
    assert options == [k for k in inspect.signature(evaluate).parameters if k != "tasks"]


def test_derived_fields_follow_from_the_options():
    run = EvalSettings(**defaults(methods=("FullKV", "snapkv", "fullkv"), budgets=(64, 0.5)))
    assert run.methods_run == ["fullkv", "snapkv"]
    assert run.checked_budgets == [Budget(64), Budget(0.5)]
    assert run.recorded_press_args == {} and run.module_settings == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.batch_size = 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_size": 0}, "--batch_size: expected a positive number, found 0"),
        ({"max_batch_tokens": -1}, "--max_batch_tokens: expected a positive number, found -1"),
        ({"budgets": ()}, "--budgets: give at least one budget"),
        ({"budgets": (0,)}, "--budgets: "),
        ({"methods": ("lookaheadkv",)}, "--adapter is required by the lookaheadkv method"),
        ({"adapters": {"a": "x"}}, "--adapters adds lookahead modules beside --adapter's"),
        ({"methods": ("quest",), "head_budget": "adaptive"}, "--head_budget adaptive spreads"),
        ({"press_args": {"fullkv": {}}}, r"press_args given for \['fullkv'\]"),
        ({"methods": ("probe",)}, "--probe is required by the probe method"),
        ({"methods": ("restorekv",)}, "press_args for restorekv: give the trained restore folder"),
        ({"shard": "3/2"}, r"--shard: expected k/n with 1 ≤ k ≤ n, found 3/2"),
        ({"shard": "1/2", "head_budget": "threshold"}, "--shard: --head_budget threshold calibrates"),
        ({"variants": ("snapkv",)}, r"--variants: expected <method>:<name> .*found 'snapkv'"),
        ({"variants": ("nokv:a",)}, r"--variants: expected <method>:<name> .*found 'nokv:a'"),
        ({"variants": ("snapkv:a b",)}, "--variants: expected <method>:<name>"),
        ({"variants": ("lookaheadkv:b",)}, "lookaheadkv takes no settings of its own here .*--adapters"),
        ({"variants": ("oracle:b",)}, "'oracle:b': oracle takes no settings of its own here"),
        (
            {"variants": ("probe:b",)},
            r"press_args for probe:b: give its probe folder, e.g. \{probe:b: \{folder",
        ),
        (
            {"methods": ("probe",), "press_args": {"probe": {"folder": "/nowhere"}}},
            "probe: folder: no probe at /nowhere",
        ),
        (
            {"methods": ("probe",), "press_args": {"probe": {"window": 3}}},
            "unknown key window; probe takes folder",
        ),
        ({"probe": "x"}, "--probe is required by the probe method .* and by nothing else"),
        (
            {"variants": ("h2o-decode:b",), "head_budget": "adaptive"},
            r"decode-time methods \['h2o-decode:b'\]",
        ),
        (
            {"variants": ("snapkv:w",), "press_args": {"snapkv:w": {"span": 4}}},
            "press_args for snapkv:w: unknown",
        ),
        (
            {"methods": ("restorekv",), "press_args": {"restorekv": {"folder": "/nowhere"}}},
            "press_args for restorekv: folder: /nowhere/restorekv.json: not found",
        ),
        (
            {"methods": ("restorekv",), "press_args": {"restorekv": {"folder": "x", "window": 4}}},
            "press_args for restorekv: unknown key window; restorekv takes folder, chunk_size, overlap, scores",
        ),
        (
            {"methods": ("restorekv",), "press_args": {"restorekv": {"folder": "x", "scores": "snapkv"}}},
            "press_args for restorekv: scores: expected one of kvzip, lookaheadkv, got 'snapkv'",
        ),
    ],
)
def test_a_bad_option_is_refused_naming_its_flag(changes, message):
    with pytest.raises(ValueError, match=message):
        EvalSettings(**defaults(**changes))


def test_a_variant_is_its_method_under_its_own_settings():
    run = EvalSettings(
        **defaults(variants=("SnapKV:w4", "snapkv:w4"), press_args={"snapkv:w4": {"window": 4}})
    )
    assert run.methods_run == ["fullkv", "snapkv", "snapkv:w4"]
    presses = run.training_free_presses()
    assert type(presses["snapkv:w4"]) is type(presses["snapkv"])
    assert presses["snapkv:w4"].window == 4 != presses["snapkv"].window


def test_restorekv_selects_with_the_lookahead_module_only_beside_it(tmp_path):
    from lkv.model.restore import RestoreAdapter
    from tests.conftest import build_tiny_model

    model, _ = build_tiny_model("llama")
    RestoreAdapter.create(model, num_tokens=2, lora_rank=2).save(tmp_path / "restore")
    args = {"restorekv": {"folder": str(tmp_path / "restore"), "scores": "lookaheadkv"}}
    with pytest.raises(ValueError, match="scores: lookaheadkv selects with the module of --adapter"):
        EvalSettings(**defaults(methods=("restorekv",), press_args=args))
    run = EvalSettings(
        **defaults(methods=("restorekv",), press_args={"restorekv": {**args["restorekv"], "scores": "kvzip"}})
    )
    assert run.recorded_press_args["restorekv"]["scores"] == "kvzip"


def test_a_probe_given_for_the_run_is_reported_where_it_replaces_a_modules_own(tmp_path):
    """`--probe` is one probe for the whole run; a module whose folder holds another probe/ fuses it instead,
    which `replaced_probes` names (lkv eval warns), and a folder's own probe given again is no replacement."""
    folders = {}
    for name in ("s0", "s1"):
        folder = tmp_path / name
        (folder / "probe").mkdir(parents=True)
        (folder / "lookahead.json").write_text('{"extra": {"preset": "long"}}')
        folders[name] = folder
    run = EvalSettings(
        **defaults(
            methods=("lookaheadkv", "probe"),
            adapter=str(folders["s0"]),
            adapters={"s1": str(folders["s1"])},
            probe=str(folders["s0"] / "probe"),
        )
    )
    assert run.replaced_probes == {"lookaheadkv:s1": folders["s1"] / "probe"}
    assert run.module_probes["lookaheadkv:s1"] == str(folders["s0"] / "probe")
    alone = EvalSettings(**defaults(methods=("lookaheadkv",), adapter=str(folders["s1"])))
    assert alone.replaced_probes == {} and alone.module_probes["lookaheadkv"] == folders["s1"] / "probe"


def test_a_probe_variant_takes_its_folder_and_probe_defaults_to_the_runs(tmp_path):
    """``probe`` reads ``--probe`` unless its press_args name a folder; each ``probe:<name>`` names its own, recorded
    with its fingerprint (``--probe``'s is run.json's ``probe`` already)."""
    for name in ("p0", "p1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "probe.json").write_text(name)
    p0, p1 = str(tmp_path / "p0"), str(tmp_path / "p1")
    run = EvalSettings(
        **defaults(
            methods=("probe",), variants=("probe:s1",), probe=p0, press_args={"probe:s1": {"folder": p1}}
        )
    )
    assert run.methods_run == ["probe", "probe:s1"]
    assert run.probe_folders == {"probe": p0, "probe:s1": p1}
    assert run.recorded_press_args == {"probe:s1": {"folder": p1, "fingerprint": fingerprint(p1)}}
    alone = EvalSettings(**defaults(methods=("probe",), press_args={"probe": {"folder": p1}}))
    assert alone.probe_folders == {"probe": p1} and alone.run_info()["probe"] is None
