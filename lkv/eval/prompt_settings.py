"""The two prompt settings an evaluation runs (``--settings``), importable without torch so that
`lkv eval --help` shows them at once: ``aware`` compresses the prompt with its question inside (the paper's),
``agnostic`` compresses the context before the question is appended."""

from __future__ import annotations

from typing import Literal, get_args

Setting = Literal["aware", "agnostic"]
"""A prompt setting's name."""

SETTINGS: tuple[Setting, ...] = get_args(Setting)
"""Every setting, in the order an evaluation runs them (the default of ``--settings``)."""
