"""One writer per label folder: `lkv label` holds the folder's lock from its first read of the finished
prompts to its last shard.

Two runs on one folder would both see the same prompts unlabelled and both write them (shards of duplicate
rows that a fit then trains on twice). The lock is an ``flock`` on ``.lkv-label.lock`` in the folder
(:class:`filelock.FileLock`): the kernel drops it when its process ends in any way (``kill -9``, the OOM
killer), so a killed run leaves no stale lock to guess about: a pid+host file
would need a liveness check that cannot see another host's processes and is fooled by reused pids. A
second writer is refused at once, naming the holder that ``.lkv-label.holder`` records (pid and host,
information only: the lock alone decides).

Only a run's global rank 0 takes the lock; the other ranks of the same run (Lightning's launcher, SLURM,
torchrun) write their own shards under it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from lkv.labels.shards import META_FILE, SHARD_GLOB

LOCK_FILE = ".lkv-label.lock"
HOLDER_FILE = ".lkv-label.holder"
# what a label folder may hold: its metadata, finished shards, the lock and the writers' temporary files
_LABEL_FILES = re.compile(
    rf"^(?:{re.escape(META_FILE)}|labels-r\d{{3}}-\d{{5}}\.parquet|{re.escape(LOCK_FILE)}|"
    rf"{re.escape(HOLDER_FILE)}|\.labels-r\d{{3}}-\d{{5}}\.parquet\.\d+\.tmp|\.{re.escape(META_FILE)}\.r\d+\.\d+\.tmp)$"
)
# environment variables that number a process within a multi-process run
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")


def check_label_folder(folder: Path) -> None:
    """Refuse ``folder`` as a label output unless it is new, empty or a label folder.

    Raises:
        NotADirectoryError: ``folder`` is a file.
        ValueError: ``folder`` holds other files (an adapter, a fit run), named in the message.
    """
    if not folder.exists():
        return
    if not folder.is_dir():
        raise NotADirectoryError(f"--output {folder}: expected a label folder, found a file")
    foreign = sorted(p.name for p in folder.iterdir() if not _LABEL_FILES.match(p.name))
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise ValueError(
            f"--output {folder}: expected a new or empty folder or a label folder ({META_FILE}, {SHARD_GLOB}), "
            f"found other files: {shown}; choose another --output"
        )


def is_global_zero() -> bool:
    """Whether this process is rank 0 of its run (no rank variable set or every one of them 0)."""
    return all(os.environ.get(name, "0") in ("", "0") for name in _RANK_VARIABLES)


@contextmanager
def label_folder_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s writer lock inside the block (rank 0; other ranks pass through).

    The folder is checked (:func:`check_label_folder`) and created; the lock file stays when the block
    ends, so a later writer locks the same file, unless the block created the folder and wrote nothing into
    it (a run refused by a later check): then the folder is removed again.

    Raises:
        FileExistsError: another process holds the lock; the message names it and the lock file.
    """
    check_label_folder(folder)
    if not is_global_zero():
        yield
        return
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FileExistsError(
            f"--output {folder}: another `lkv label` is writing this folder ({_holder(folder)}); wait for it "
            f"to end, or write elsewhere (the lock is {folder / LOCK_FILE}, released when its process ends)"
        ) from None
    try:
        (folder / HOLDER_FILE).write_text(f"pid {os.getpid()} on host {socket.gethostname()}\n")
        yield
    finally:
        if created and {p.name for p in folder.iterdir()} <= {LOCK_FILE, HOLDER_FILE}:
            # a run that failed before writing anything leaves no folder; removed while still locked, so no
            # other writer can hold the lock of a file that is going away
            for name in (HOLDER_FILE, LOCK_FILE):
                (folder / name).unlink(missing_ok=True)
            folder.rmdir()
        lock.release()


def _holder(folder: Path) -> str:
    """What the holder recorded (pid and host), or that it has not recorded it yet."""
    try:
        return (folder / HOLDER_FILE).read_text().strip()
    except OSError:
        return "its pid and host not recorded yet"
