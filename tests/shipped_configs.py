"""The YAML configs the repository ships, for the tests that parse them: ``configs/**`` (what a user runs:
model recipes, eval suites, sweeps, the demo) and ``experiments/<study>/configs/**`` (the fits and evals of
the committed studies, kept beside the results they wrote)."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def shipped_configs() -> list[Path]:
    """Every ``*.yaml`` under configs/ and under an experiments/<study>/configs/ folder, sorted."""
    return sorted(
        [*(ROOT / "configs").glob("**/*.yaml"), *(ROOT / "experiments").glob("*/configs/**/*.yaml")]
    )


def top_level_sections(path: Path) -> set[str]:
    """The first part of each top-level key (``model.init_args.x`` counts as ``model``); empty for a file
    whose content is not a mapping."""
    content = yaml.safe_load(path.read_text()) or {}
    return {key.split(".", 1)[0] for key in content} if isinstance(content, dict) else set()


def is_fit_config(path: Path) -> bool:
    """A LightningCLI (`lkv fit`) config: it sets ``model`` or ``trainer``."""
    return bool({"model", "trainer"} & top_level_sections(path))
