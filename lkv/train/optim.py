"""The optimiser settings every trained predictor shares, and the AdamW + per-step schedule built from them.

:class:`OptimSettings` is one ``model.optim`` section of a fit config (LightningCLI shows each field:
``--model.optim.lr``, ...). :func:`build_optimizer` makes one AdamW over one or more parameter groups, each with
its own settings (a lookahead module and the probe trained beside it: lr 1e-3 vs KVzap's 5e-3) and its own
warm-up and decay in one ``LambdaLR`` (one lambda per group); AdamW's update is per element, so a group trains
exactly as it would alone. :func:`clip_gradients` clips one group's gradients alone, so a group's clipping never
depends on another's gradients either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

SCHEDULERS = ("cosine", "constant")
Settings = TypeVar("Settings")


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and its learning-rate schedule (stepped once per optimiser step).

    Attributes:
        lr: peak learning rate.
        betas: Adam betas (paper: 0.9, 0.95).
        weight_decay: decoupled weight decay (0 = plain Adam).
        warmup_steps: optimiser steps of linear warm-up from 0.
        scheduler: ``cosine`` (decay to ``min_lr_ratio · lr`` at the last step) or ``constant``.
        min_lr_ratio: final learning rate of the cosine schedule, as a fraction of ``lr``.
    """

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    scheduler: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"optim.scheduler: expected 'cosine' or 'constant', found {self.scheduler!r}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError(
                f"optim.lr must be positive and optim.warmup_steps ≥ 0, found {self.lr} and {self.warmup_steps}"
            )
        # YAML gives a list; a tuple keeps the settings hashable and equal to their defaults
        object.__setattr__(self, "betas", tuple(self.betas))


# Checkpoints keep the settings among the module's hyper-parameters, and Lightning resumes a fit with
# `torch.load(weights_only=True)`: allow this class there.
torch.serialization.add_safe_globals([OptimSettings])


def as_settings(value: Settings | dict[str, Any], kind: type[Settings], where: str) -> Settings:
    """``value`` as the dataclass ``kind``: LightningCLI hands a module chosen by ``model.class_path`` its
    dataclass arguments as plain dicts.

    Raises:
        ValueError: naming ``where`` (``model.optim``) for a dict with other keys than ``kind``'s fields.
    """
    if not isinstance(value, dict):
        return value
    try:
        return kind(**value)
    except TypeError as err:
        raise ValueError(f"{where}: expected the fields of {kind.__name__} ({err})") from None


@dataclass
class ParamGroup:
    """Parameters trained with one :class:`OptimSettings`; ``name`` labels the group in the logged learning
    rates (``lr-AdamW/<name>``) when the optimiser has more than one."""

    name: str
    params: list[torch.nn.Parameter]
    settings: OptimSettings


def _lr_lambda(settings: OptimSettings, total_steps: float) -> Callable[[int], float]:
    """The learning-rate factor of step ``k`` under ``settings`` (transformers' schedules)."""
    if settings.scheduler == "cosine":
        if total_steps == float("inf"):
            raise ValueError(
                "the cosine schedule needs a known length: set trainer.max_steps (a streamed label set has no "
                "length), or use model.optim.scheduler=constant"
            )
        total = max(int(total_steps), settings.warmup_steps + 1)
        make = lambda opt: get_cosine_with_min_lr_schedule_with_warmup(  # noqa: E731
            opt, settings.warmup_steps, total, min_lr_rate=settings.min_lr_ratio
        )
    else:
        make = lambda opt: get_constant_schedule_with_warmup(opt, settings.warmup_steps)  # noqa: E731
    # transformers builds the factor into a LambdaLR: take it from one on a throwaway optimiser
    scratch = torch.optim.SGD([torch.nn.Parameter(torch.zeros(()))], lr=1.0)
    return make(scratch).lr_lambdas[0]


def build_optimizer(groups: Sequence[ParamGroup], total_steps: float) -> dict[str, Any]:
    """One AdamW over ``groups`` (each its own lr, betas, weight decay) and a per-step ``LambdaLR`` with each
    group's own schedule, as Lightning's optimiser dict.

    Args:
        total_steps: optimiser steps of the fit (``trainer.estimated_stepping_batches``), the cosine's length.
    """
    named = len(groups) > 1
    optimizer = torch.optim.AdamW(
        [
            {
                "params": group.params,
                "lr": group.settings.lr,
                "betas": group.settings.betas,
                "weight_decay": group.settings.weight_decay,
                **({"name": group.name} if named else {}),
            }
            for group in groups
        ]
    )
    lambdas = [_lr_lambda(group.settings, total_steps) for group in groups]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def clip_gradients(params: Sequence[torch.nn.Parameter], value: float, algorithm: str | None) -> None:
    """Clip ``params``' gradients as Lightning's ``gradient_clip_val`` / ``gradient_clip_algorithm`` do
    (``norm``, the default, or ``value``), over these parameters alone."""
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, value)
    else:
        torch.nn.utils.clip_grad_norm_(params, value)
