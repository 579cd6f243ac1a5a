"""`lkv eval --only_solved FOLDER`: run only the prompts the full-cache model answered right in an earlier run.

A needle the full-cache model cannot retrieve measures the model, not the eviction; paired comparisons count
*kept* only on FullKV-solved samples (:func:`lkv.eval.paired.fullkv_solved`). Screening a new run by an earlier
folder's FullKV rows spends no prefill on the rest: a new method is scored on exactly the solved samples of a
committed set, paired with its rows by sample id. (:class:`~lkv.eval.tasks.GeneraliseTask`'s own
``screened_by`` does more: it picks, per source and distance bin, which candidates form the set.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lkv.eval.paired import solved_in
from lkv.eval.results import check_same_samples
from lkv.eval.tasks import Sample


@dataclass(frozen=True)
class SolvedScreen:
    """The samples FullKV answered right (score 1) in ``folder``, per (task, setting), and its rows."""

    folder: Path
    solved: dict[tuple[str, str], frozenset[str]]
    rows: list[dict[str, Any]]

    @classmethod
    def load(cls, folder: str | Path, tasks: Sequence[str], settings: Sequence[str]) -> SolvedScreen:
        """Read ``folder``'s results file (or that file itself); the errors of
        :func:`~lkv.eval.paired.solved_in`."""
        cells = [(task, setting) for task in tasks for setting in settings]
        return cls(*solved_in(folder, cells, "--only_solved"))

    def keeps(self, task: str, sample: str, setting: str) -> bool:
        """Whether FullKV solved ``sample`` of ``task`` in ``setting``."""
        return sample in self.solved[(task, setting)]

    def samples(self, task: str, samples: Sequence[Sample], settings: Sequence[str]) -> Iterator[Sample]:
        """The ``samples`` solved in at least one of ``settings``, in their order.

        Raises:
            ValueError: a sample that now builds another prompt than the screen's rows of its id were scored on
                (:func:`~lkv.eval.results.check_same_samples`): their outcome says nothing of this prompt.
        """
        check_same_samples({s.id: s.meta for s in samples}, self.rows, task, f"--only_solved {self.folder}")
        return (s for s in samples if any(self.keeps(task, s.id, setting) for setting in settings))
