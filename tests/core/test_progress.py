"""Progress lines where output is not a terminal: a line every `every` items and at the end, with the
time left from this run's pace; none when disabled."""

from __future__ import annotations

import pytest

from lkv.core import progress as progress_module
from lkv.core.progress import Progress, minutes


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter that advances 10 s per call after the first."""
    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(ticks))


def test_lines_every_n_items_and_at_the_end(capsys, clock):
    bar = Progress("lkv test", 5, "prompts", every=2)
    for _ in range(5):
        bar.update(note="x")
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "lkv test: 2/5 prompts (40%)",
        "lkv test: 4/5 prompts (80%)",
        "lkv test: 5/5 prompts (100%)",
    ]
    # started at t=0, the line of item 2 is read at t=10: 5 s per item, 3 items left
    assert lines[0] == "lkv test: 2/5 prompts (40%), 0 min 10 s, ~0 min 15 s left, x"
    assert "left" not in lines[-1]


def test_a_resumed_stage_counts_from_where_it_was(capsys, clock):
    bar = Progress("lkv fit", 100, "steps", every=25, start=40)
    bar.advance_to(50)
    bar.advance_to(75)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in out] == [
        "lkv fit: 50/100 steps (50%)",
        "lkv fit: 75/100 steps (75%)",
    ]
    assert out[0].endswith("~0 min 50 s left")  # this run's pace: 10 steps in 10 s, 50 steps to go


def test_disabled_prints_nothing_and_the_default_is_about_twenty_lines(capsys):
    bar = Progress("lkv test", 7, "prompts", enabled=False)
    for _ in bar.track(range(7)):
        pass
    assert capsys.readouterr().out == ""
    for _ in Progress("lkv test", 200, "steps").track(range(200)):
        pass
    assert len(capsys.readouterr().out.splitlines()) == 20


def test_minutes():
    assert minutes(125.4) == "2 min 05 s"
