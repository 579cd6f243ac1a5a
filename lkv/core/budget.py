"""The KV budget ``C``: how much of a prompt's cache each KV head keeps, as one checked value.

A budget is either a whole number of tokens per KV head (``128``, the paper's) or a ratio of the prompt in
``(0, 1]`` (``0.25``). It is checked once, where it enters (the CLI, a config, the Python API:
:meth:`Budget.of`); everything after takes a :class:`Budget` and trusts it. The per-layer counts an
eviction keeps (``layer_budgets``: a method may spread ``C`` over layers) derive from :meth:`Budget.tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """A checked KV budget: ``value`` is an ``int`` ≥ 1 (tokens per KV head) or a ``float`` in ``(0, 1]``
    (a ratio of the prompt length ``S``). Build it with :meth:`of`.

    ``str(budget)`` is its results-row form (``"128"``, ``"0.25"``; :func:`lkv.eval.results.budget_key`).
    """

    value: int | float

    def __post_init__(self) -> None:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"budget must be an int (tokens per head) or a float ratio, got {value!r}")
        if isinstance(value, int):
            if value <= 0:
                raise ValueError(f"budget must be ≥ 1 token per head, got {value}")
            return
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"budget must be positive: a ratio in (0, 1] or a whole number of tokens, got {value}"
            )
        if value > 1:
            if not value.is_integer():
                raise ValueError(
                    f"budget {value} is neither a ratio in (0, 1] nor a whole number of tokens per head (e.g. 128)"
                )
            # a whole float above 1 (128.0, as a command line may give it) counts as tokens
            object.__setattr__(self, "value", int(value))

    @classmethod
    def of(cls, budget: Budget | int | float) -> Budget:
        """``budget`` as a :class:`Budget` (checked unless it already is one)."""
        return budget if isinstance(budget, Budget) else cls(budget)

    @property
    def is_ratio(self) -> bool:
        """True for a ratio of the prompt, false for a number of tokens per KV head."""
        return isinstance(self.value, float)

    def tokens(self, prompt_len: int) -> int:
        """Tokens kept per KV head for a prompt of ``prompt_len`` (a ratio rounds, keeping at least one)."""
        return max(1, round(self.value * prompt_len)) if self.is_ratio else self.value

    def whole_tokens(self) -> int:
        """The budget as tokens per KV head, for settings that take no ratio."""
        if self.is_ratio:
            raise ValueError(f"expected a whole number of tokens ≥ 1, got the ratio {self.value}")
        return self.value

    def __str__(self) -> str:
        return str(self.value)


def token_budgets(values: Sequence[Budget | int], what: str) -> tuple[int, ...]:
    """Checked budgets ``C`` of a setting that takes whole tokens only (Recall@C, a decode-time cap).

    Args:
        values: one or more budgets.
        what: the setting's name, which starts every error (``model.eval_budgets``).
    """
    if not values:
        raise ValueError(f"{what}: give at least one budget C (tokens per KV head)")
    try:
        return tuple(Budget.of(value).whole_tokens() for value in values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what}: {error}") from None
