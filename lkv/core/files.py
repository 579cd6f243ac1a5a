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


def check_safetensors(path: Path, what: str) -> None:
    """Refuse a missing, truncated or foreign safetensors file before anything is loaded from it.

    Reads only the header (safetensors checks that the data it describes fills the file).

    Raises:
        FileNotFoundError: ``path`` is missing (``what`` says which file it should be).
        ValueError: ``path`` does not read as a safetensors file.
    """
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found ({what})")
    try:
        with safe_open(str(path), framework="numpy") as handle:
            handle.keys()
    except SafetensorError as error:
        raise ValueError(
            f"{path}: expected a complete safetensors file ({what}), found an unreadable one ({error})"
        ) from None


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``.

    Raises:
        ValueError: undecodable bytes (a binary file, another encoding): ``what``, the file and the byte.
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(path, error, what) from None


def not_utf8(path: Path, error: UnicodeDecodeError, what: str) -> ValueError:
    """The one-line error of ``path`` (named as ``what``) failing to decode as UTF-8 with ``error``."""
    byte = error.object[error.start : error.start + 1].hex()
    return ValueError(
        f"{what} {path}: expected UTF-8 text, found the byte 0x{byte} that UTF-8 cannot decode (a binary file, "
        "or another encoding: save it as UTF-8)"
    )
