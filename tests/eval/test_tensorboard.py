"""TensorBoard event files of `lkv eval` reports, read back with TensorBoard's own event reader."""

from __future__ import annotations

from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar.layout_pb2 import Layout

from lkv.eval.report import write_report
from lkv.eval.tensorboard import write_eval_runs
from tests.conftest import fit
from tests.tensorboard_events import curve, hparams_plugin_data, points_per_step, runs, scalars


def result_rows() -> list[dict[str, Any]]:
    """Rows as ``results.jsonl`` holds them: NIAH (2 settings × FullKV + 2 methods × 2 budgets × 2 samples)
    and one importance row per method."""
    rows = []
    for setting in ("aware", "agnostic"):
        for sample in ("s0", "s1"):
            cells = [("fullkv", "full", 1.0)]
            cells += [
                (m, b, 0.5 if m == "snapkv" else 0.75)
                for m in ("snapkv", "lookaheadkv")
                for b in ("64", "128")
            ]
            for method, budget, score in cells:
                rows.append(
                    {
                        "task": "niah",
                        "setting": setting,
                        "sample": sample,
                        "method": method,
                        "budget": budget,
                        "score": score,
                        "metrics": {"string_match": score},
                        "meta": {},
                    }
                )
    for method in ("snapkv", "lookaheadkv"):
        metrics = {"recall@64": 0.4, "recall@128": 0.6, "kendall_tau": 0.3}
        rows.append(
            {
                "task": "importance",
                "setting": "aware",
                "sample": "p0",
                "method": method,
                "budget": "-",
                "score": 0.4,
                "metrics": metrics,
                "meta": {},
            }
        )
    return rows


def test_a_regenerated_report_adds_no_duplicate_points(tmp_path):
    rows = result_rows()
    write_report(rows, tmp_path)
    first = points_per_step(tmp_path / "tensorboard")
    write_report(rows, tmp_path)  # `lkv demo` writes its report twice; a rerun of `lkv eval` once more
    again = points_per_step(tmp_path / "tensorboard")
    assert first and again == first
    assert {key: n for key, n in again.items() if n != 1} == {}


def cells(with_interval: bool) -> list[dict[str, Any]]:
    """Summary cells of one task and setting: FullKV and two methods at C = 64 and 128, with the cell's
    sample count and, optionally, its 95 % interval."""
    out = []
    for method, budget, score in [
        ("fullkv", "full", 1.0),
        ("snapkv", "64", 0.5),
        ("snapkv", "128", 0.7),
        ("lookaheadkv", "64", 0.8),
        ("lookaheadkv", "128", 0.9),
    ]:
        cell = {
            "task": "niah",
            "setting": "aware",
            "method": method,
            "budget": budget,
            "n": 8,
            "score": score,
        }
        if with_interval:
            cell |= {"ci_low": score - 0.1, "ci_high": min(1.0, score + 0.1)}
        out.append(cell)
    return out


def layout(events: EventAccumulator) -> Layout:
    proto = Layout()
    proto.ParseFromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    return proto


def test_methods_are_runs_that_share_tags_with_the_budget_as_step(tmp_path):
    write_eval_runs(cells(with_interval=True), tmp_path / "eval")
    found = runs(tmp_path / "eval")
    assert set(found) == {"fullkv", "snapkv", "lookaheadkv"}
    for method, events in found.items():
        assert scalars(events) == [
            "interval/niah/aware/score/high",
            "interval/niah/aware/score/low",
            "niah/aware/score",
        ]
        expected = {"fullkv": [(64, 1.0), (128, 1.0)], "snapkv": [(64, 0.5), (128, 0.7)]}
        assert curve(events, "niah/aware/score") == expected.get(method, [(64, 0.8), (128, 0.9)])
        assert "budget C" in events.SummaryMetadata("niah/aware/score").summary_description
    assert curve(found["snapkv"], "interval/niah/aware/score/low") == [(64, 0.4), (128, 0.6)]
    charts = {c.title: c for category in layout(found["snapkv"]).category for c in category.chart}
    margin = charts["aware/score"].margin.series[0]
    assert (margin.value, margin.lower, margin.upper) == (
        "niah/aware/score",
        "interval/niah/aware/score/low",
        "interval/niah/aware/score/high",
    )


def test_cells_without_an_interval_get_line_charts_and_no_bounds(tmp_path):
    write_eval_runs(cells(with_interval=False), tmp_path / "eval")
    events = runs(tmp_path / "eval")["snapkv"]
    assert scalars(events) == ["niah/aware/score"]
    [chart] = [c for category in layout(events).category for c in category.chart]
    assert chart.WhichOneof("content") == "multiline"
    assert list(chart.multiline.tag) == [r"^niah/aware/score$"]


def test_ratio_budgets_get_their_own_tags_in_thousandths(tmp_path):
    summary = [
        {"task": "niah", "setting": "aware", "method": "snapkv", "budget": b, "n": 1, "score": s}
        for b, s in (("64", 0.5), ("0.064", 0.25))
    ]
    write_eval_runs(summary, tmp_path / "eval")
    events = runs(tmp_path / "eval")["snapkv"]
    assert curve(events, "niah/aware/score") == [(64, 0.5)]
    assert curve(events, "niah/aware/score_ratio") == [(64, 0.25)]
    assert "× 1000" in events.SummaryMetadata("niah/aware/score_ratio").summary_description


def test_a_rewrite_drops_runs_of_methods_no_longer_in_the_results(tmp_path):
    write_eval_runs(cells(with_interval=False), tmp_path / "eval")
    write_eval_runs([c for c in cells(with_interval=False) if c["method"] != "snapkv"], tmp_path / "eval")
    assert set(runs(tmp_path / "eval")) == {"fullkv", "lookaheadkv"}
    assert [p.name for p in tmp_path.iterdir()] == ["eval"]  # no staging folders left behind


def test_a_fit_names_its_validation_metrics_in_hparams_and_captions_its_image(
    tiny_backbone,  # noqa: F811
    label_folders,  # noqa: F811
    tmp_path,
):
    # The logger keeps Lightning's default `hp_metric` placeholder: the module's session must still win.
    fit(tmp_path, label_folders, max_steps=3)
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"images": 0}).Reload()
    metrics, params = hparams_plugin_data(events)
    assert metrics == ["val/kl", "val/recall@4", "val/recall@8", "val/kendall_tau"]
    assert set(metrics) <= set(scalars(events))  # the values the HParams tab shows
    assert params["model.num_lookahead"] == 4 and params["model.eval_budgets"] == "4+8"
    assert params["data.val"] == str(label_folders["val"])

    [image] = events.Images("val/importance")
    assert (image.step, image.width) == (3, 640) and image.height >= 480
    caption = events.SummaryMetadata("val/importance").summary_description
    assert (
        caption == f"prompt {image_prompt_id(label_folders)} · step 3 · validation ({label_folders['val']})"
    )


def image_prompt_id(folders) -> str:
    """The id of the first validation prompt (the one ImportanceImages plots)."""
    from lkv.train.datamodule import LabelDataModule

    data = LabelDataModule(train=str(folders["train"]), val=str(folders["val"]))
    data.setup("fit")
    return next(iter(data.val_dataloader()))[0]["id"]
