"""Written files get the permissions the user's umask gives any new file.

safetensors writes its files through a private temporary file (mode ``0600``) renamed into place: an
exported adapter or probe would then be unreadable to the group and others even under ``umask 022``, unlike
every other file of the folder.
"""

from __future__ import annotations

import os
from pathlib import Path


def umask() -> int:
    """This process's umask (read by setting it and putting it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(*paths: Path) -> None:
    """Give each of ``paths`` the mode of a new regular file, ``0o666 & ~umask``."""
    mode = 0o666 & ~umask()
    for path in paths:
        path.chmod(mode)
