"""Intervals and paired tests against published/closed-form values, and the report's use of them."""

import csv
import math
import random

import pytest

from lkv.eval.paired import paired_comparisons
from lkv.eval.report import summarize, write_report
from lkv.eval.stats import (
    Z95,
    binomial_two_sided,
    bootstrap_interval,
    mcnemar_exact,
    mean_interval,
    paired_bootstrap,
    paired_difference_interval,
    paired_test,
    stratified_bootstrap_interval,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # R: prop.test(x, n, correct = FALSE)$conf.int (the Wilson score interval)
        (5, 10, 0.2365931, 0.7634069),
        (0, 10, 0.0, 0.2775328),
        (10, 10, 0.7224672, 1.0),
    ],
)
def test_wilson_interval_matches_r(k, n, low, high):
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-6)


@pytest.mark.parametrize(("k", "n"), [(5, 6), (50, 60), (1, 61), (17, 23)])
def test_wilson_bounds_are_where_the_score_test_reaches_z(k, n):
    # Wilson's definition: the proportions x with (k/n − x)² = z²·x(1 − x)/n.
    for x in wilson_interval(k, n):
        assert (k / n - x) ** 2 == pytest.approx(Z95**2 * x * (1 - x) / n, rel=1e-9, abs=1e-12)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(7, 6)
    with pytest.raises(ValueError, match="n must be positive"):
        wilson_interval(0, 0)


@pytest.mark.parametrize(
    ("k", "n", "p"),
    [
        (0, 6, 0.03125),  # 2 / 2**6
        (1, 10, 0.021484375),  # R: binom.test(1, 10)$p.value
        (3, 10, 0.34375),
        (5, 10, 1.0),
        (0, 0, 1.0),
        (2, 20, 0.0004024506),
    ],
)
def test_exact_binomial_two_sided(k, n, p):
    assert binomial_two_sided(k, n) == pytest.approx(p, rel=1e-6)


def test_mcnemar_counts_only_discordant_pairs():
    # 40 pairs: both right 20, both wrong 10, A-only 9, B-only 1 → p = binom.test(1, 10) = 0.0215.
    a = [1] * 20 + [0] * 10 + [1] * 9 + [0] * 1
    b = [1] * 20 + [0] * 10 + [0] * 9 + [1] * 1
    result = mcnemar_exact(a, b)
    assert (result.wins, result.losses, result.n) == (9, 1, 40)
    assert result.diff == pytest.approx(8 / 40)
    assert result.p == pytest.approx(0.021484375) and result.significant
    assert result.low < result.diff < result.high
    assert paired_test(a, b).test == "mcnemar"
    assert mcnemar_exact(a, a).p == 1.0 and not mcnemar_exact(a, a).significant
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([0.5, 1.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="equally long"):
        mcnemar_exact([1, 0], [1])


def test_paired_interval_matches_a_published_implementation():
    # R package contingencytables (Fagerland, Lydersen & Laake), tests/testthat/test-ch8.R:
    # Newcombe_square_and_add_CI_paired_2x2(matrix(c(59, 6, 16, 80), 2, byrow=TRUE)) → -0.0621 (-0.1186 to -0.0046)
    low, high = paired_difference_interval(59, 6, 16, 80)
    assert (low, high) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    assert paired_difference_interval(59, 16, 6, 80) == pytest.approx((-high, -low))  # sides swapped
    a = [1] * 59 + [1] * 6 + [0] * 16 + [0] * 80
    b = [1] * 59 + [0] * 6 + [1] * 16 + [0] * 80
    assert (mcnemar_exact(a, b).low, mcnemar_exact(a, b).high) == (low, high)
    with pytest.raises(ValueError, match="non-negative counts"):
        paired_difference_interval(0, 0, 0, 0)


def test_paired_interval_covers_when_one_side_rarely_wins():
    """Where one method wins most discordant pairs, the interval still covers the true difference ~95 % of
    the time (an interval from the discordant share alone covers ~60 % here), and its upper end lies above
    the estimate even with no losses."""
    rng = random.Random(0)
    n, first_only, second_only, reps = 83, 0.20, 0.01, 400
    covered = 0
    for _ in range(reps):
        cells = [0, 0, 0, 0]  # both, first only, second only, neither
        for _ in range(n):
            u = rng.random()
            cells[
                0
                if u < 0.5
                else 1
                if u < 0.5 + first_only
                else 2
                if u < 0.5 + first_only + second_only
                else 3
            ] += 1
        low, high = paired_difference_interval(*cells)
        covered += low <= first_only - second_only <= high
    assert covered / reps >= 0.92
    result = mcnemar_exact([1] * 10 + [1] * 20, [0] * 10 + [1] * 20)
    assert result.losses == 0 and result.high > result.diff > result.low > 0


def test_bootstrap_interval_of_a_mean():
    assert bootstrap_interval([0.4] * 8) == pytest.approx((0.4, 0.4))
    rng = random.Random(1)
    values = [rng.gauss(0.5, 0.1) for _ in range(200)]
    low, high = bootstrap_interval(values)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    # With n = 200 the percentile bootstrap agrees with the normal interval mean ± 1.96·sd/√n to a few %.
    assert low == pytest.approx(mean - 1.96 * sd / math.sqrt(200), abs=0.004)
    assert high == pytest.approx(mean + 1.96 * sd / math.sqrt(200), abs=0.004)
    assert bootstrap_interval(values) == (low, high)  # seeded: reproducible


def test_paired_bootstrap_separates_a_shift_from_noise():
    rng = random.Random(2)
    base = [rng.random() for _ in range(60)]
    shifted = [min(1.0, v + 0.2) for v in base]
    noisy = [v + rng.gauss(0, 0.01) for v in base]
    clear = paired_bootstrap(shifted, base)
    assert clear.significant and clear.diff > 0 and clear.low > 0 and clear.test == "bootstrap"
    assert not paired_bootstrap(noisy, base).significant
    assert paired_bootstrap(base, base).p == 1.0


def test_mean_interval_follows_the_task_kind():
    assert mean_interval([1.0, 0.0, 1.0]) == wilson_interval(2, 3)
    # An edit-similarity cell of only 0s and 1s is still a continuous metric: bootstrap, not Wilson.
    assert mean_interval([1.0, 0.0, 1.0], binary=False) != wilson_interval(2, 3)
    with pytest.raises(ValueError, match="all 0 or 1"):
        mean_interval([0.5], binary=True)


def _rows(scores: dict[tuple[str, str], list[float]], task: str = "niah") -> list[dict]:
    rows = []
    for (method, budget), values in scores.items():
        for i, value in enumerate(values):
            rows.append(
                {
                    "task": task,
                    "sample": f"s{i}",
                    "method": method,
                    "budget": budget,
                    "setting": "aware",
                    "score": value,
                    "metrics": {"string_match": value},
                    "meta": {
                        "family": "date" if i % 2 else "magic_number",
                        "distribution": "ood",
                        "length": 3072 if i < 10 else 1024,
                    },
                }
            )
    return rows


def test_summary_rows_carry_n_and_interval():
    rows = _rows({("fullkv", "full"): [1.0] * 5 + [0.0], ("snapkv", "64"): [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]})
    summary = {e["method"]: e for e in summarize(rows)}
    assert summary["fullkv"]["n"] == 6 and isinstance(summary["fullkv"]["n"], int)
    assert (summary["fullkv"]["ci_low"], summary["fullkv"]["ci_high"]) == wilson_interval(5, 6)
    assert summary["snapkv"]["ci_low"] <= summary["snapkv"]["score"] <= summary["snapkv"]["ci_high"]


def test_paired_comparisons_against_fullkv_and_the_best_baseline(tmp_path):
    n = 30
    rows = _rows(
        {
            ("fullkv", "full"): [1.0] * n,
            ("lookaheadkv", "64"): [1.0] * (n - 2) + [0.0] * 2,
            ("snapkv", "64"): [1.0] * 10 + [0.0] * (n - 10),
            ("tova", "64"): [1.0] * 5 + [0.0] * (n - 5),
            ("quest", "64"): [1.0] * n,  # keeps the whole cache: never the best *eviction* baseline
            ("lookaheadkv", "128"): [1.0] * (n - 2) + [0.0] * 2,
            ("snapkv", "128"): [1.0] * 10 + [0.0] * (n - 10),
            ("tova", "128"): [1.0] * (n - 3) + [0.0] * 3,  # within noise of LookaheadKV
        }
    )
    comparisons = paired_comparisons(rows)
    found = {(c["method"], c["reference"]): c for c in comparisons if c["budget"] == "64"}
    lkv_best = found[("lookaheadkv", "best baseline")]
    assert lkv_best["baseline"] == "snapkv" and lkv_best["significant"]
    assert (lkv_best["wins"], lkv_best["losses"]) == (18, 0)
    lkv_full = found[("lookaheadkv", "fullkv")]
    assert not lkv_full["significant"] and (lkv_full["kept"], lkv_full["solved"]) == (n - 2, n)
    assert found[("snapkv", "fullkv")]["significant"] and ("snapkv", "best baseline") not in found
    # the trained method against each baseline, one by one; the others only against FullKV and the best
    each = {(c["baseline"], c["budget"]): c for c in comparisons if c["reference"] == "baseline"}
    assert set(each) == {(m, b) for m in ("snapkv", "tova") for b in ("64", "128")}
    assert {c["method"] for c in comparisons if c["reference"] == "baseline"} == {"lookaheadkv"}
    assert each[("tova", "64")]["significant"] and not each[("tova", "128")]["significant"]

    report = write_report(rows, tmp_path, methods=["fullkv", "lookaheadkv", "snapkv", "tova", "quest"])
    text = report.read_text()
    assert "## Paired comparisons" in text
    assert "lookaheadkv vs best baseline: above it outside noise at C=64" in text
    assert "| lookaheadkv | tova | **+76.7 (23/0)" in text
    assert (
        "lookaheadkv vs every training-free baseline (snapkv, tova): beats each outside noise at C=64; "
        "not at C=128 (tova: +3.3, p=1)." in text
    )
    assert "lookaheadkv vs fullkv: within noise at C=64" in text
    assert "-6.7 (0/2) p=0.5, kept 28/30 = 93 % [79, 98] |" in text  # the retention's Wilson interval
    assert "n = 30 per cell" in text and "smoke test" not in text.split("## Paired")[0]
    assert "by needle family" in text and "magic_number (ood, n = 15)" in text
    # by length: lengths ascending, FullKV's one row per sample counted at every budget
    by_length = text.split("**niah** by context length (tokens), question-aware")[1].split("\n\n")[1]
    assert by_length.splitlines()[2].startswith("| 1024 (n = 20) | fullkv | 100.0 | 100.0 |")
    assert "| 1024 (n = 20) | lookaheadkv | 90.0 | 90.0 |" in by_length  # its 2 misses: samples 28, 29
    assert "| 3072 (n = 10) | lookaheadkv | 100.0 | 100.0 |" in by_length
    with (tmp_path / "comparisons.csv").open() as handle:
        assert {r["method"] for r in csv.DictReader(handle)} == {"lookaheadkv", "snapkv", "tova", "quest"}


def test_a_trained_probe_is_the_strongest_competitor_not_a_training_free_baseline(tmp_path):
    n = 30
    rows = _rows(
        {
            ("fullkv", "full"): [1.0] * n,
            ("lookaheadkv", "64"): [1.0] * (n - 2) + [0.0] * 2,
            ("probe", "64"): [1.0] * 20 + [0.0] * (n - 20),
            ("snapkv", "64"): [1.0] * 10 + [0.0] * (n - 10),
            ("lookaheadkv", "128"): [1.0] * n,
            ("probe", "128"): [1.0] * 5 + [0.0] * (n - 5),
            ("snapkv", "128"): [1.0] * 10 + [0.0] * (n - 10),
        }
    )
    found = {(c["method"], c["reference"], c["budget"]): c for c in paired_comparisons(rows)}
    assert found[("lookaheadkv", "best baseline", "64")]["baseline"] == "snapkv"  # the probe is trained
    strongest = found[("lookaheadkv", "strongest competitor", "64")]
    assert strongest["baseline"] == "probe" and (strongest["wins"], strongest["losses"]) == (8, 0)
    # where a training-free baseline is the strongest, the best-baseline row says it once
    assert ("lookaheadkv", "strongest competitor", "128") not in found
    assert ("lookaheadkv", "probe", "64") not in {
        (c["method"], c["baseline"], c["budget"]) for c in found.values() if c["reference"] == "baseline"
    }
    text = write_report(rows, tmp_path, methods=["fullkv", "lookaheadkv", "probe", "snapkv"]).read_text()
    assert "| lookaheadkv | strongest competitor | **+26.7 (8/0) p=0.0078 vs probe" in text


def test_a_run_without_training_free_baselines_names_none(tmp_path):
    n = 30
    rows = _rows({("fullkv", "full"): [1.0] * n, ("lookaheadkv", "64"): [1.0] * (n - 2) + [0.0] * 2})
    text = write_report(rows, tmp_path, methods=["fullkv", "lookaheadkv"]).read_text()
    assert "Each method against FullKV on the same samples." in text
    assert "among )" not in text and "best training-free" not in text.split("## Paired")[1].split("\n\n")[1]


def test_small_cells_are_labelled_a_smoke_test(tmp_path):
    rows = _rows({("fullkv", "full"): [1.0] * 6, ("snapkv", "64"): [1.0] * 2 + [0.0] * 4})
    text = write_report(rows, tmp_path).read_text()
    assert "n = 6 per cell) — *smoke test" in text
    assert "| snapkv | 33.3 [10, 70] |" in text


def test_a_partial_run_breaks_down_only_the_lengths_each_setting_has(tmp_path):
    rows = _rows({("fullkv", "full"): [1.0] * 12, ("snapkv", "64"): [0.0] * 12})
    agnostic = [r | {"setting": "agnostic"} for r in rows if r["meta"]["length"] == 3072]  # 1K not run yet
    text = write_report(rows + agnostic, tmp_path).read_text()
    table = text.split("by context length (tokens), question-agnostic")[1].split("## Plots")[0]
    assert "| 3072 (n = 10) | snapkv | 0.0 |" in table and "1024" not in table


def test_a_report_of_fullkv_alone_has_no_comparisons_or_breakdown_tables(tmp_path):
    rows = _rows({("fullkv", "full"): [1.0, 0.0, 1.0, 1.0]})
    text = write_report(rows, tmp_path).read_text()
    assert "| fullkv |" in text and "Paired comparisons" not in text
    assert "by needle family" not in text and "by context length" not in text
    assert not (tmp_path / "comparisons.csv").exists()


def test_stratified_bootstrap_of_one_group_is_the_plain_bootstrap_and_weighs_groups_equally():
    values = [random.Random(3).random() for _ in range(25)]
    assert stratified_bootstrap_interval([values], seed=4) == bootstrap_interval(values, seed=4)
    # two constant groups of different sizes: every draw's mean of means is (0 + 1) / 2, not the pooled 0.2
    assert stratified_bootstrap_interval([[0.0] * 8, [1.0] * 2]) == (0.5, 0.5)
    low, high = stratified_bootstrap_interval([[0, 1, 1, 0], [1.0, 0.5, 0.0]])
    assert low < (0.5 + 0.5) / 2 < high
    with pytest.raises(ValueError, match="each with a value"):
        stratified_bootstrap_interval([[1.0], []])


def test_generalise_rows_break_down_by_measured_distance_source_and_kind():
    from lkv.eval.report import breakdown_tables

    def row(sample: int, method: str, budget: str, score: float) -> dict:
        meta = {"bin": "far" if sample < 3 else "near", "source": "text-folder", "kind": "date"}
        return {
            "task": "generalise",
            "sample": f"s{sample}",
            "method": method,
            "budget": budget,
            "setting": "aware",
            "score": score,
            "meta": meta,
        }

    rows = [row(i, "fullkv", "full", 1.0) for i in range(5)]
    rows += [row(i, "snapkv", "128", float(i >= 2)) for i in range(5)]
    table = "\n".join(breakdown_tables(rows, "bin", ["fullkv", "snapkv"]))
    assert "**generalise** by the needle's measured distance from the end (far ≥ 1,536 tokens" in table
    assert "| far (n = 3) | fullkv | 100.0 |" in table and "| far (n = 3) | snapkv | 33.3 |" in table
    assert "| near (n = 2) | snapkv | 100.0 |" in table
    assert breakdown_tables(rows, "source") == []  # one source: nothing to break down
