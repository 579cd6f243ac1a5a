"""Bridges to other tools (an optional extra each). Above eviction: core, model, labels, eviction, eval and train
never import this package (pyproject's import-linter layers)."""
