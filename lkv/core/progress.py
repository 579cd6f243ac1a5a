"""A stage's progress that shows wherever the output goes: a bar on a terminal, plain lines in a file.

A progress bar redraws one terminal line; written to a log file or a pipe, Lightning's bar prints nothing
until its loop ends and tqdm's turns into one ever-growing line. :class:`Progress` prints
``lkv label: 24/80 prompts (30 %), 2 min 05 s, ~4 min 50 s left`` instead, every ``every`` items and at
the end, whenever standard output is not a terminal.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")

# Lines per stage when output is not a terminal: often enough to see a stage move, few enough to read.
LINES_PER_STAGE = 20


def interactive() -> bool:
    """Whether standard output is a terminal (bars redraw there; elsewhere lines are printed)."""
    return sys.stdout.isatty()


def counted(number: int, noun: str) -> str:
    """``'1 prompt'``, ``'8 prompts'``: ``number`` and ``noun``, plural unless it is one."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def minutes(seconds: float) -> str:
    """``'2 min 05 s'``."""
    return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


class Progress:
    """Progress of ``total`` items of one stage.

    On a terminal: a tqdm bar (``bar=False`` when a Lightning loop draws its own); elsewhere one line every
    ``every`` items (default: about :data:`LINES_PER_STAGE` lines in all) and one when the last item is done.

    Args:
        name: what the lines start with (``"lkv label"``).
        total: items of the whole stage; ``start`` of them may be done already (a resumed run).
        unit: the items' name, plural (``"prompts"``, ``"steps"``).
        enabled: False shows nothing at all (``--progress false``).
        bar: draw a tqdm bar on a terminal.
        every: items between two lines.
        start: items done before this run (the remaining time is estimated from this run's pace).
    """

    def __init__(
        self,
        name: str,
        total: int,
        unit: str,
        enabled: bool = True,
        bar: bool = True,
        every: int | None = None,
        start: int = 0,
    ) -> None:
        self.name, self.total, self.unit = name, total, unit
        self.every = every or max(1, math.ceil(total / LINES_PER_STAGE))
        self.done = self.start = start
        self.next_line = (start // self.every + 1) * self.every
        self.began = time.perf_counter()
        self.lines = enabled and not interactive()
        self.bar = tqdm(
            total=total,
            initial=start,
            desc=name,
            unit=unit.removesuffix("s"),
            disable=not (enabled and bar and interactive()),
        )

    def update(self, n: int = 1, note: str = "") -> None:
        """``n`` more items done; ``note`` (a loss, the current sample) ends the line."""
        self.advance_to(self.done + n, note)

    def advance_to(self, done: int, note: str = "") -> None:
        """``done`` items done in all."""
        self.bar.update(done - self.done)  # a disabled bar does nothing
        if note and not self.bar.disable:
            self.bar.set_postfix_str(note)
        self.done = done
        if self.lines and (done >= self.next_line or done >= self.total):
            self.next_line = (done // self.every + 1) * self.every
            print(self.line(note), flush=True)

    def line(self, note: str = "") -> str:
        """``'NAME: done/total unit (pct), elapsed, ~remaining left[, note]'``."""
        elapsed = time.perf_counter() - self.began
        text = f"{self.name}: {self.done}/{self.total} {self.unit}"
        if self.total:
            text += f" ({self.done / self.total:.0%})"
        text += f", {minutes(elapsed)}"
        ran = self.done - self.start
        if ran > 0 and self.done < self.total:
            text += f", ~{minutes(elapsed / ran * (self.total - self.done))} left"
        return f"{text}, {note}" if note else text

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, each counted done when the next is asked for (after the loop's body ran), then closed."""
        for item in items:
            yield item
            self.update()
        self.close()

    def close(self) -> None:
        self.bar.close()
