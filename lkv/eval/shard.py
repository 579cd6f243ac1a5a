"""One of ``n`` disjoint shares of an evaluation's samples (`lkv eval --shard k/n`), for processes or machines
that fill one output folder together.

Sample ``i`` of a task (in the task's own order; a multi-question task's contexts, not its questions) belongs to
shard ``i mod n + 1``, so each shard gets every ``n``-th sample: lengths drawn per sample spread evenly, and the
shards of one command never write the same row. Rows are appended one ``write`` each to a file opened for
appending, so processes on one folder do not interleave them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1 ≤ index ≤ count); ``Shard(1, 1)`` is every sample."""

    index: int = 1
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ValueError(f"expected k/n with 1 ≤ k ≤ n, found {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"k/n"`` (e.g. ``"2/4"``)."""
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if match is None:
            raise ValueError(f"expected k/n with 1 ≤ k ≤ n (e.g. 1/2), found {text!r}")
        return cls(int(match[1]), int(match[2]))

    @property
    def whole(self) -> bool:
        """Every sample (no sharding)."""
        return self.count == 1

    def size(self, total: int) -> int:
        """How many of ``total`` items this shard holds."""
        return len(range(self.index - 1, total, self.count))

    def of(self, items: Iterable[T]) -> Iterator[T]:
        """The items of this shard: every ``count``-th, from the ``index``-th."""
        return (item for i, item in enumerate(items) if i % self.count == self.index - 1)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: every sample
WHOLE = Shard()
