"""The sweep/ablation summary of :mod:`lkv.sweep.grid`: intervals in its tables, a one-axis grid's plot."""

import csv

from lkv.sweep.grid import write_summary


def _result(size: int, recall: float, interval: list[float] | None) -> dict:
    result = {
        "point": f"limit_train_samples={size}",
        "values": {"data.limit_train_samples": size},
        "fit_s": 60.0,
        "metrics": {"eval/importance/recall@64": recall, "val/kl": 0.1},
    }
    if interval is not None:
        result["intervals"] = {"eval/importance/recall@64": interval}
    return result


def test_a_one_axis_grid_gets_intervals_in_its_tables_and_a_plot(tmp_path):
    results = [_result(64, 0.75, [0.7, 0.8, 32]), _result(128, 0.76, [0.74, 0.78, 32])]
    grid = {"data.limit_train_samples": [64, 128]}
    summary = write_summary(
        results, tmp_path, grid, "eval/importance/recall@64", "data.limit_train_samples", "model.lora_targets"
    )
    text = summary.read_text()
    assert "| 64 | 0.750 [0.700, 0.800] |" in text and "| 128 | 0.760 [0.740, 0.780] |" in text
    assert "_low" not in text and "mean [95 % interval]" in text and "| 0.100 |" in text
    assert (tmp_path / "plots" / "score_vs_size.png").stat().st_size > 0  # no group key: one line
    with (tmp_path / "summary.csv").open() as handle:
        first = next(csv.DictReader(handle))
    assert (first["eval/importance/recall@64_low"], first["eval/importance/recall@64_n"]) == ("0.7", "32")


def test_results_without_intervals_keep_the_plain_table(tmp_path):
    grid = {"data.limit_train_samples": [64]}
    text = write_summary([_result(64, 0.75, None)], tmp_path, grid, "val/kl", "x.size", "x.group").read_text()
    assert "| 64 | 0.100 | 60.000 | 0.750 |" in text and "interval" not in text
    assert not (tmp_path / "plots").exists()  # the size key is not in the grid
