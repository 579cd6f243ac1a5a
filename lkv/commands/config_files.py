"""The ``--config`` files of a command line, read before any parser: a missing file or malformed YAML is
named with its path and line, where the parser would say ``"<unicode string>", line 2`` or print a traceback.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lkv.core.files import read_text


def config_paths(args: list[str]) -> list[str]:
    """The values of every ``--config FILE`` and ``--config=FILE`` in ``args``, in order."""
    given = [value for flag, value in zip(args, args[1:], strict=False) if flag == "--config"]
    return given + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def check_config_files(args: list[str]) -> None:
    """Read every ``--config`` file of ``args`` and the files it includes (a top-level ``config:``, relative
    to the including file, as `lkv fit` reads them).

    Raises:
        FileNotFoundError: a file that does not exist, named as given.
        ValueError: a file that is not YAML, with the line and column of the problem.
    """
    for value in config_paths(args):
        if value.lstrip().startswith(("{", "[")):  # an inline YAML or JSON config, not a path
            continue
        _read(Path(value), "--config")


def _read(path: Path, named_by: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{named_by} {path}: no such file")
    try:
        content = yaml.safe_load(read_text(path, named_by))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"{path}{where}: malformed YAML ({problem})") from None
    includes = content.get("config") if isinstance(content, dict) else None
    for include in [includes] if isinstance(includes, str) else includes or []:
        _read(path.parent / include, f"{path}: config:")
