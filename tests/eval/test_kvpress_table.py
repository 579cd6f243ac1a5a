"""kvpress's protocol: the suite's ratios ↔ lkv budgets, the suite itself, and kvpress's table from synthetic
rows (scores, n, intervals, the paired test, the FullKV = 0 tasks, the AdaKV rows of a second folder)."""

import json
from pathlib import Path

import pytest
import yaml
from jsonargparse import ActionConfigFile, ArgumentParser

import lkv.commands.eval
from lkv.commands.eval_settings import EvalSettings
from lkv.core.budget import Budget
from lkv.eval.kvpress_table import TABLE_FILE, compression_ratio, kvpress_table, main, read_folder
from lkv.eval.stats import mcnemar_exact, paired_bootstrap, stratified_bootstrap_interval
from lkv.eval.tasks import RulerTask
from tests.shipped_configs import ROOT

SUITE = ROOT / "configs" / "eval" / "kvpress_protocol.yaml"
KVPRESS_RATIOS = (0.25, 0.5, 0.75, 0.875)  # evaluation/leaderboard.sh


@pytest.mark.parametrize("ratio", KVPRESS_RATIOS)
def test_each_kvpress_ratio_is_the_budget_that_keeps_the_rest(ratio):
    kept = Budget(1 - ratio)
    assert compression_ratio(kept) == ratio
    # kvpress's ScorerPress keeps int(S · (1 − ratio)) per head; lkv keeps round(S · kept), at least one: the
    # same count when S · kept is whole (every 4,096-token prompt) and never more than one entry apart
    for length in range(1, 9000):
        theirs, ours = int(length * (1 - ratio)), kept.tokens(length)
        assert ours - theirs in (0, 1), length
        if (length * kept.value).is_integer() and theirs >= 1:
            assert ours == theirs, length
    assert kept.tokens(4096) == int(4096 * (1 - ratio))
    # the first prompt length where they differ: lkv rounds 2.75 (S = 11 at 0.25 kept) up, kvpress down
    assert (Budget(0.25).tokens(11), int(11 * (1 - 0.75))) == (3, 2)


@pytest.mark.parametrize("budget", [128, 1.0])
def test_a_budget_that_is_no_ratio_below_one_has_no_compression_ratio(budget):
    with pytest.raises(ValueError, match="not a ratio in \\(0, 1\\)"):
        compression_ratio(Budget(budget))


def test_the_suite_is_kvpress_protocol_and_its_methods_are_lkv_methods():
    config = yaml.safe_load(SUITE.read_text())
    assert config["settings"] == ["agnostic"]
    assert [compression_ratio(Budget(b)) for b in config["budgets"]] == sorted(KVPRESS_RATIOS)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(lkv.commands.eval.evaluate)
    adapters = ROOT / "experiments" / "reach" / "adapters"
    args = ["--config", str(SUITE), "--adapter", str(adapters / "gold_s0")]
    built = parser.instantiate(parser.parse_args([*args, "--probe", str(adapters / "probe_gold_s0")]))
    assert all(isinstance(t, RulerTask) and list(t.lengths) == [4096] for t in built.tasks)
    assert {t.task for t in built.tasks} == {
        *(f"niah_{v}" for v in ("single_1", "single_2", "single_3", "multikey_1", "multikey_2")),
        *("niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"),
    }
    options = {k: v for k, v in vars(built).items() if k not in ("tasks", "config")}
    for head_budget in ("equal", "adaptive"):  # the suite and its documented AdaKV run
        settings = EvalSettings(**{**options, "head_budget": head_budget})
        assert set(settings.methods_run) == {
            "fullkv",
            "lookaheadkv",
            "probe",
            "kvzip",
            "expected_attention",
            "keydiff",
            "snapkv",
            "pyramidkv",
            "streamingllm",
        }


def _rows(method, budget, scores, task="niah_single_1", first=0):
    return [
        {"task": task, "sample": f"s{first + i}", "method": method, "budget": budget, "setting": "agnostic",
         "score": s}
        for i, s in enumerate(scores)
    ]  # fmt: skip


def _folder_rows():
    """One equal-budget folder: FullKV solves 3 of 4 niah_single_1, 2 of 2 vt, 0 of 2 cwe; snapkv and the
    reference at 0.75 and 0.125 kept; vt's scores are fractions (string_match_all of several values)."""
    rows = _rows("fullkv", "full", [1, 1, 1, 0]) + _rows("fullkv", "full", [1, 1], "vt")
    rows += _rows("fullkv", "full", [0, 0], "cwe")
    rows += _rows("snapkv", "0.75", [1, 0, 1, 0]) + _rows("snapkv", "0.75", [0.5, 1.0], "vt")
    rows += _rows(
        "snapkv", "0.75", [1, 1], "cwe"
    )  # FullKV = 0: never averaged in, even where a method scores
    rows += _rows("snapkv", "0.125", [0, 0, 0, 0]) + _rows("snapkv", "0.125", [0.0, 0.5], "vt")
    for budget in ("0.75", "0.125"):
        rows += _rows("lookaheadkv:agnostic", budget, [1, 1, 1, 0]) + _rows(
            "lookaheadkv:agnostic", budget, [1, 1], "vt"
        )
    return rows


def test_kvpress_table_averages_tasks_pairs_samples_and_sets_fullkv_zero_tasks_apart():
    adakv = _rows("fullkv", "full", [1, 1, 1, 0]) + _rows("snapkv", "0.75", [1, 1, 1, 1])
    adakv += _rows("snapkv", "0.75", [1.0, 1.0], "vt")
    table = kvpress_table([_folder_rows(), adakv])
    assert table.tasks == ["niah_single_1", "vt"] and table.fullkv_zero == ["cwe"]
    assert list(table.rows) == ["no_press", "snapkv", "adakv_snapkv", "lookaheadkv:agnostic"]
    assert list(table.rows["no_press"]) == [0.0] and table.rows["no_press"][0.0].score == 100 * (0.75 + 1) / 2
    snap = table.rows["snapkv"]
    assert list(snap) == [0.25, 0.875]
    # the mean of the task means (0.5 and 0.75), not the pooled mean of six samples (4/6)
    assert snap[0.25].score == pytest.approx(100 * (0.5 + 0.75) / 2) and snap[0.25].n == 6
    low, high = stratified_bootstrap_interval([[1, 0, 1, 0], [0.5, 1.0]])
    assert (snap[0.25].low, snap[0.25].high) == pytest.approx((100 * low, 100 * high))
    assert snap[0.25].low <= snap[0.25].score <= snap[0.25].high
    # paired on the same (task, sample) pairs with the reference at the same ratio; vt's fractions: bootstrap
    reference = [1, 1, 1, 0, 1, 1]
    assert snap[0.25].paired == paired_bootstrap([1, 0, 1, 0, 0.5, 1.0], reference)
    assert snap[0.875].score == pytest.approx(100 * (0 + 0.25) / 2)
    ada = table.rows["adakv_snapkv"]
    assert list(ada) == [0.25] and ada[0.25].score == 100.0 and ada[0.25].n == 6
    assert ada[0.25].paired == mcnemar_exact([1, 1, 1, 1, 1, 1], reference)  # all 0/1: exact McNemar
    assert table.rows["lookaheadkv:agnostic"][0.25].paired is None
    text = table.markdown()
    assert "| press | 0 | 0.25 | 0.875 |" in text
    assert "| snapkv | – | 62.5 | 12.5 |" in text and "| adakv_snapkv | – | 100.0 | – |" in text
    assert "FullKV = 0 (left out of every average above): cwe." in text


def test_min_solved_sets_apart_the_tasks_fullkv_answers_too_few_samples_of_fully():
    """niah_single_1: FullKV answers 3 of 4 fully; vt: 2 of 2. At 0.75 both are averaged, above it vt alone, in
    every row, no_press included."""
    assert kvpress_table([_folder_rows()], min_solved=0.75).tasks == ["niah_single_1", "vt"]
    table = kvpress_table([_folder_rows()], min_solved=0.8)
    assert (
        table.tasks == ["vt"] and table.unsolved == {"niah_single_1": (3, 4)} and table.fullkv_zero == ["cwe"]
    )
    assert table.rows["no_press"][0.0].score == 100.0
    snap = table.rows["snapkv"][0.25]
    assert snap.score == pytest.approx(75.0) and snap.n == 2
    assert snap.paired == paired_bootstrap([0.5, 1.0], [1, 1])
    assert "fewer than 80 % of the samples fully (left out too): niah_single_1 (3/4)." in table.markdown()
    assert "fewer than" not in kvpress_table([_folder_rows()]).markdown()
    with pytest.raises(ValueError, match=r"min_solved .* \[0, 1\], got 1.5"):
        kvpress_table([_folder_rows()], min_solved=1.5)


def test_without_the_reference_the_table_says_there_are_no_paired_tests():
    rows = [r for r in _folder_rows() if r["method"] != "lookaheadkv:agnostic"]
    table = kvpress_table([rows])
    assert all(c.paired is None for cells in table.rows.values() for c in cells.values())
    assert "no lookaheadkv:agnostic rows: no paired tests here" in table.markdown()
    paired = kvpress_table([rows], reference="snapkv").rows["no_press"][0.0]
    assert paired.paired is None  # FullKV's ratio 0 has no reference rows


def test_a_cell_without_rows_of_an_averaged_task_says_so():
    rows = [r for r in _folder_rows() if not (r["method"] == "snapkv" and r["task"] == "vt")]
    cell = kvpress_table([rows]).rows["snapkv"][0.25]
    assert cell.missing == ("vt",) and cell.score == 50.0 and cell.n == 4
    text = kvpress_table([rows]).markdown()
    assert "| snapkv | – | 50.0* | 0.0* |" in text and "50.0 [" in text and "(4), without vt;" in text
    only_zero = (
        _rows("fullkv", "full", [1])
        + _rows("fullkv", "full", [0], "cwe")
        + _rows("snapkv", "0.5", [1], "cwe")
    )
    with pytest.raises(ValueError, match="snapkv at budget 0.5: no scores on the tasks FullKV solves"):
        kvpress_table([only_zero])


def test_a_folder_without_fullkv_or_with_token_budgets_is_refused():
    with pytest.raises(ValueError, match="no fullkv rows"):
        kvpress_table([[r for r in _folder_rows() if r["method"] != "fullkv"]])
    with pytest.raises(ValueError, match="budget 128 is not a ratio"):
        kvpress_table([_folder_rows() + _rows("snapkv", "128", [1, 1, 1, 1])])


def _write_folder(folder: Path, rows, head_budget):
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"model": "smollm2-135m", "head_budget": head_budget}))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_command_reads_both_folders_and_writes_the_table(tmp_path, capsys):
    _write_folder(tmp_path / "plain", _folder_rows(), "equal")
    _write_folder(tmp_path / "adakv", _rows("snapkv", "0.125", [1, 1, 1, 1]), "adaptive")
    main([str(tmp_path / "plain"), str(tmp_path / "adakv")])
    printed = capsys.readouterr().out
    assert "| adakv_snapkv | – | – | 100.0* |" in printed  # its folder has no vt rows
    assert (tmp_path / "plain" / TABLE_FILE).read_text() + "\n" == printed
    with pytest.raises(ValueError, match="adakv/run.json: head_budget is 'adaptive', expected 'equal'"):
        read_folder(tmp_path / "adakv", "equal")
    with pytest.raises(SystemExit, match="no results.jsonl and run.json"):
        main([str(tmp_path / "plain"), str(tmp_path / "missing")])
    main([str(tmp_path / "plain"), "--min_solved", "0.8"])
    assert "Tasks: vt." in capsys.readouterr().out
