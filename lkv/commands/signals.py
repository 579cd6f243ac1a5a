"""Signal handling shared by the long-running verbs (`lkv sweep`, `lkv eval`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (a scheduler's pre-emption, ``kill``) into ``SystemExit(143)`` inside the block.

    Python's default SIGTERM ends the process at once, skipping ``finally`` blocks and ``except`` clauses:
    a sweep would leave its running `lkv fit` child behind and an eval would write no report of its rows so
    far. An exception runs both. Outside the main thread (where handlers cannot be set) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
