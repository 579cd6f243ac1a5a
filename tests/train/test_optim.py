"""The shared optimiser settings: one AdamW whose parameter groups each follow their own settings and schedule
exactly as an optimiser of their own would."""

import pytest
import torch
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from lkv.train.optim import OptimSettings, ParamGroup, as_settings, build_optimizer


def alone(settings: OptimSettings, total: int, grads: list[torch.Tensor]) -> tuple[list[float], torch.Tensor]:
    """An AdamW and transformers schedule of ``settings`` over one parameter: its lr and weight per step."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW(
        [param], lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
    )
    if settings.scheduler == "cosine":
        schedule = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, settings.warmup_steps, total, min_lr_rate=settings.min_lr_ratio
        )
    else:
        schedule = get_constant_schedule_with_warmup(optimizer, settings.warmup_steps)
    lrs = []
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
        schedule.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs, param.detach()


def test_each_group_steps_as_an_optimiser_of_its_own():
    first = OptimSettings(lr=1e-2, warmup_steps=2, min_lr_ratio=0.1)
    second = OptimSettings(lr=5e-3, betas=(0.8, 0.9), weight_decay=0.1, warmup_steps=0, scheduler="constant")
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))]
    built = build_optimizer(
        [ParamGroup("module", [params[0]], first), ParamGroup("probe", [params[1]], second)], 8
    )
    optimizer, schedule = built["optimizer"], built["lr_scheduler"]["scheduler"]
    assert [g["name"] for g in optimizer.param_groups] == ["module", "probe"]
    grads = [torch.randn(3, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    lrs = []
    for grad in grads:
        params[0].grad, params[1].grad = grad.clone(), -grad
        optimizer.step()
        schedule.step()
        lrs.append([g["lr"] for g in optimizer.param_groups])
    for index, (settings, sign) in enumerate(((first, 1), (second, -1))):
        want_lrs, want = alone(settings, 8, [sign * g for g in grads])
        assert [lr[index] for lr in lrs] == want_lrs
        torch.testing.assert_close(params[index].detach(), want, atol=0, rtol=0)


def test_one_group_is_unnamed_and_a_cosine_needs_a_length():
    settings = OptimSettings()
    built = build_optimizer([ParamGroup("module", [torch.nn.Parameter(torch.ones(1))], settings)], 4)
    assert "name" not in built["optimizer"].param_groups[0]  # logged as `lr-AdamW`, as before
    with pytest.raises(
        ValueError, match=r"cosine schedule needs a known length.*model\.optim\.scheduler=constant"
    ):
        build_optimizer([ParamGroup("module", [torch.nn.Parameter(torch.ones(1))], settings)], float("inf"))


def test_settings_from_a_config_dict_and_bad_settings():
    assert as_settings({"lr": 2e-3, "betas": [0.9, 0.99]}, OptimSettings, "model.optim") == OptimSettings(
        lr=2e-3, betas=(0.9, 0.99)
    )
    with pytest.raises(ValueError, match=r"model\.optim: expected the fields of OptimSettings .*lrr"):
        as_settings({"lrr": 1.0}, OptimSettings, "model.optim")
    with pytest.raises(
        ValueError, match=r"optim\.scheduler: expected 'cosine' or 'constant', found 'linear'"
    ):
        OptimSettings(scheduler="linear")
