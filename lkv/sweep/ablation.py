"""An ablation over lookahead settings inside one fit: sibling lookahead modules trained on the main one's prefills.

The frozen prefill is the expensive part of the two-phase step and the same for every lookahead module, so a
grid over ``num_lookahead``, ``lora_targets``, ``lookahead_init``, ... (the settings of
:meth:`LookaheadAdapter.create`), ``seed``, ``max_position_offset`` (the training step's position-offset
augmentation) or the loss's ``topc_loss_*`` and ``copy_boost`` need not be one fit per point (``lkv sweep``).
:class:`LookaheadAblation` builds one *sibling* module per grid point beside the LightningModule's own, on the
same frozen model: its own embeddings, its own LoRA (a named peft adapter), its own AdamW and learning-rate schedule, built by the main
module's :meth:`~lkv.train.module.LookaheadKVModule.optimizer_for` (same settings). The main module shares each
sample's prefill (:class:`~lkv.train.base.SharedPrefill`); after the main step every sibling runs its own
lookahead step on that cache and steps its optimiser whenever the main one does (gradient accumulation,
clipping and DDP averaging as for the main module). A grid point with the main module's own settings is the
main module itself.

Logged (TensorBoard overlays the points): ``ablation/<point>/train/loss`` every step and, after every
validation, ``ablation/<point>/val/kl``, ``…/val/recall@C`` for the main module's ``eval_budgets`` and
``…/val/kendall_tau`` (:func:`lkv.core.metrics.ranking_metrics`, on the device), ``<point>`` as named by
:func:`lkv.sweep.grid.point_name` (``num_lookahead=4,lora_targets=q_proj+v_proj``), the names ``lkv sweep``
gives its points. Checkpoints hold every sibling's trainable weights, optimiser and schedule (the callback's
state), so a resumed fit continues all of them.

At the end of the fit (global rank 0), in ``output`` (default ``<log_dir>/ablation``): every point's lookahead
step timed against a plain prefill (:func:`lkv.perf.overhead.lookahead_overhead`), ``adapters/<point>/``
(an ``lkv export`` folder per point, for ``lkv eval --adapter``; a joint fit's probe is in each, so every point
runs at the fit's preset), and the summary of :func:`lkv.sweep.grid.write_summary` (``summary.csv``,
``summary.md``, ``results/``, ``plots/score_vs_size.png``, ``plots/overhead_vs_size.png``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MetricCollection

from lkv.core.metrics import ranking_metrics
from lkv.model.lookahead import LookaheadAdapter
from lkv.perf.overhead import lookahead_overhead
from lkv.sweep.grid import grid_points, point_name, write_summary
from lkv.train.base import SharedPrefill
from lkv.train.export import save_lookahead_folder
from lkv.train.module import LookaheadKVModule, adapter_settings, draw_position_offset, training_loss
from lkv.train.optim import clip_gradients

# Module settings a grid may vary: the arguments of `LookaheadAdapter.create` and the training step's position
# offset and loss (its top-C term and copy boost); the optimiser is the main one's.
ABLATION_KEYS = (
    "num_lookahead",
    "lookahead_init",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "seed",
    "max_position_offset",
    "topc_loss_weight",
    "topc_loss_budget",
    "copy_boost",
)
PREFIX = "ablation"
# A GradScaler would have to scale every sibling's loss too.
UNSUPPORTED_PRECISION = ("16-mixed",)


@dataclass
class Point:
    """One grid point and, unless it is the main module's own settings, its sibling module and optimiser.

    Attributes:
        name: :func:`point_name` of ``values`` (logs, folders).
        values: grid key → value.
        settings: every :data:`ABLATION_KEYS` setting of the point (the main module's, overridden by ``values``).
        adapter, optimizer, scheduler, metrics: the sibling (None for the main module's point).
        own_s: wall seconds of the sibling's own steps (training and validation; the shared prefill excluded).
        metrics_last: the last validation's ``val/...`` values.
    """

    name: str
    values: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    adapter: LookaheadAdapter | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    metrics: MetricCollection | None = None
    own_s: float = 0.0
    metrics_last: dict[str, float] = field(default_factory=dict)


def _same(a: Any, b: Any) -> bool:
    """Equal as configuration values (a tuple equals a list)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


class LookaheadAblation(L.Callback):
    """Sibling lookahead modules, one per point of ``grid``, trained in the same fit on the main module's prefills.

    Args:
        grid: module setting → values, one point per combination (the first key varying slowest), e.g.
            ``{num_lookahead: [4, 16], lora_targets: [none, [q_proj, v_proj], all-linear]}``; keys from
            :data:`ABLATION_KEYS`, every other setting (and the optimiser) is the main module's.
        output: folder of the summary and exported adapters (default: ``<log_dir>/ablation``).
        score: the metric of the summary's ``group × size`` table and score plot.
        size_key, group_key: the grid keys of the plots' x axis and lines.
        overhead_tokens: prompt length of the end-of-fit lookahead-step vs prefill timing (0: no timing).
        overhead_repeats: timed rounds of it (medians).
    """

    def __init__(
        self,
        grid: dict[str, list[Any]],
        output: str | None = None,
        score: str = "val/recall@64",
        size_key: str = "num_lookahead",
        group_key: str = "lora_targets",
        overhead_tokens: int = 1024,
        overhead_repeats: int = 5,
    ) -> None:
        unknown = sorted(set(grid) - set(ABLATION_KEYS))
        if unknown:
            raise ValueError(
                f"LookaheadAblation.grid: keys {unknown} are not lookahead module settings; expected some of "
                f"{list(ABLATION_KEYS)}"
            )
        self.grid = grid
        self.values = grid_points(grid)
        self.output = output
        self.score = score
        self.size_key = size_key
        self.group_key = group_key
        self.overhead_tokens = overhead_tokens
        self.overhead_repeats = overhead_repeats
        self.points: list[Point] | None = None
        self._restored: dict[str, Any] | None = None
        self._fit_s = 0.0
        self._fit_start = 0.0
        self._step_before = 0

    # -- building -------------------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(pl_module, LookaheadKVModule):
            raise TypeError(f"LookaheadAblation needs a LookaheadKVModule, got {type(pl_module).__name__}")
        if str(trainer.precision) in UNSUPPORTED_PRECISION:
            raise ValueError(
                f"LookaheadAblation: trainer.precision {trainer.precision!r} is not supported (its gradient "
                "scaler would have to scale the siblings' losses too); use bf16-mixed or 32-true"
            )
        pl_module.share_prefill = True

    def on_fit_start(self, trainer: L.Trainer, pl_module: LookaheadKVModule) -> None:
        if self.points is None:
            self.points = self._build(trainer, pl_module)
            if self._restored is not None:
                self._restore(self._restored)
        self._fit_start = time.perf_counter()

    def _build(self, trainer: L.Trainer, pl_module: LookaheadKVModule) -> list[Point]:
        hp = pl_module.hparams
        main = {key: hp[key] for key in ABLATION_KEYS}
        host = pl_module.adapter.model
        points = []
        # Sibling LoRA initialisation seeds the global generator (as a fresh module's does): leave the run's
        # random stream as it was. Under the strategy's init context, as the main module's were built.
        with torch.random.fork_rng(devices=[]), trainer.strategy.tensor_init_context():
            for index, values in enumerate(self.values):
                settings = {**main, **values}
                point = Point(point_name(values), values, settings)
                if not _same(settings, main):
                    point.adapter = LookaheadAdapter.create(
                        host,
                        **adapter_settings(settings),
                        adapter_name=f"{PREFIX}{index}",  # peft names may not hold the point name's dots
                    )
                    point.adapter.config.base_model = pl_module.signature.to_dict()
                    host = point.adapter.model  # a PeftModel once any module has LoRA: the next ones join it
                    optim = pl_module.optimizer_for(list(point.adapter.trainable_parameters().values()))
                    point.optimizer = optim["optimizer"]
                    point.scheduler = optim["lr_scheduler"]["scheduler"]
                    budgets = list(hp.eval_budgets)
                    prefix = f"{PREFIX}/{point.name}/val/"
                    point.metrics = ranking_metrics(budgets, prefix).to(pl_module.device)
                points.append(point)
        names = [p.name for p in points]
        if len(set(names)) != len(names):
            raise ValueError(f"LookaheadAblation.grid: points with the same name {names}")
        return points

    def _siblings(self) -> list[Point]:
        return [p for p in self.points or [] if p.adapter is not None]

    def siblings(self) -> dict[str, tuple[LookaheadAdapter, str]]:
        """Every sibling module by point name, with the prefix of its logged validation metrics
        (``ablation/<point>/val``), for other callbacks of the fit (:class:`lkv.train.callbacks.SiblingModules`);
        the main module's own point is not a sibling."""
        return {p.name: (p.adapter, f"{PREFIX}/{p.name}/val") for p in self._siblings()}

    # -- training -------------------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_before = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        prefills: list[SharedPrefill] = outputs["prefills"]
        # The main optimiser stepped in this batch (the end of an accumulation window): so do the siblings.
        stepped = trainer.global_step > self._step_before
        for point in self._siblings():
            start = time.perf_counter()
            with trainer.precision_plugin.train_step_context():
                losses = []
                for index, p in enumerate(prefills):
                    offset = draw_position_offset(
                        point.settings["max_position_offset"],
                        point.settings["seed"],
                        trainer.current_epoch,
                        batch_idx,
                        index,
                    )
                    pred = point.adapter.predict(p.cache, p.prompt_len, p.position_offset + offset)[0]
                    losses.append(training_loss(p.target, pred, point.settings, batch[index]).mean())
                loss = torch.stack(losses).mean()
            # Lightning divides the main loss by the accumulation window the same way.
            (loss / trainer.accumulate_grad_batches).backward()
            if stepped:
                self._optimizer_step(trainer, point)
            point.own_s += time.perf_counter() - start
            pl_module.log(f"{PREFIX}/{point.name}/train/loss", loss.detach(), batch_size=len(prefills))

    def _optimizer_step(self, trainer: L.Trainer, point: Point) -> None:
        params = list(point.adapter.trainable_parameters().values())
        if trainer.world_size > 1:  # the main module's gradients are averaged by DDP; the siblings' here
            for p in params:
                if p.grad is not None:
                    p.grad = trainer.strategy.reduce(p.grad, reduce_op="mean")
        if trainer.gradient_clip_val:
            clip_gradients(params, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        point.optimizer.step()
        point.optimizer.zero_grad()
        point.scheduler.step()

    # -- validation -----------------------------------------------------------------------------------------

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.points is None or trainer.sanity_checking or outputs is None:
            return
        for point in self._siblings():
            start = time.perf_counter()
            with torch.no_grad(), trainer.precision_plugin.val_step_context():
                for p in outputs["prefills"]:
                    point.metrics.update(point.adapter.predict(p.cache, p.prompt_len)[0], p.target)
            point.own_s += time.perf_counter() - start

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: LookaheadKVModule) -> None:
        if self.points is None or trainer.sanity_checking:
            return
        for point in self.points:
            if point.adapter is None:
                # the main module's own metrics (Lightning logs them as `val/...` and resets them later)
                values = {k: float(v) for k, v in pl_module.val_metrics.compute().items()}
            else:
                prefix = f"{PREFIX}/{point.name}/"
                values = {k.removeprefix(prefix): float(v) for k, v in point.metrics.compute().items()}
                point.metrics.reset()
            point.metrics_last = values
            pl_module.log_dict({f"{PREFIX}/{point.name}/{k}": v for k, v in values.items()})

    # -- the end: timing, adapters, summary -----------------------------------------------------------------

    def on_fit_end(self, trainer: L.Trainer, pl_module: LookaheadKVModule) -> None:
        if self.points is None:
            return
        self._fit_s += time.perf_counter() - self._fit_start
        self._fit_start = time.perf_counter()
        if not trainer.is_global_zero:
            return
        output = Path(self.output or Path(trainer.log_dir or trainer.default_root_dir) / PREFIX)
        adapters = {p.name: p.adapter or pl_module.adapter for p in self.points}
        cost = {}
        if self.overhead_tokens > 0:
            cost = lookahead_overhead(
                pl_module.adapter.model, adapters, self.overhead_tokens, self.overhead_repeats
            )
        results = []
        for point in self.points:
            # as `lkv export` writes the main module: base model, labels' setting, and the probe beside it
            save_lookahead_folder(pl_module, output / "adapters" / point.name, adapters[point.name])
            own = {} if point.adapter is None else {"own_s": point.own_s}
            results.append(
                {
                    "point": point.name,
                    "values": point.values,
                    "fit_s": self._fit_s,
                    "metrics": point.metrics_last,
                    "cost": {**cost.get(point.name, {}), **own},
                }
            )
        summary = write_summary(results, output, self.grid, self.score, self.size_key, self.group_key)
        rank_zero_info(f"lookahead ablation: {len(results)} points; summary: {summary}")

    # -- checkpoints ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self.points is None:
            return self._restored or {}
        elapsed = time.perf_counter() - self._fit_start if self._fit_start else 0.0
        return {
            "fit_s": self._fit_s + elapsed,
            "points": {
                p.name: {
                    "own_s": p.own_s,
                    "metrics_last": p.metrics_last,
                    **(
                        {}
                        if p.adapter is None
                        else {
                            "weights": {n: w.detach() for n, w in p.adapter.trainable_parameters().items()},
                            "optimizer": p.optimizer.state_dict(),
                            "scheduler": p.scheduler.state_dict(),
                        }
                    ),
                }
                for p in self.points
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning restores callbacks before `on_fit_start` builds the siblings: apply it then.
        self._restored = state_dict
        if self.points is not None:
            self._restore(state_dict)

    def _restore(self, state: dict[str, Any]) -> None:
        saved = state.get("points", {})
        names = [p.name for p in self.points]
        if sorted(saved) != sorted(names):
            raise ValueError(
                f"LookaheadAblation: the checkpoint holds the points {sorted(saved)}, this grid has "
                f"{sorted(names)}; resume with the grid it was written with"
            )
        self._fit_s = state.get("fit_s", 0.0)
        for point in self.points:
            entry = saved[point.name]
            point.own_s, point.metrics_last = entry["own_s"], dict(entry["metrics_last"])
            if point.adapter is None:
                continue
            params = point.adapter.trainable_parameters()
            if sorted(params) != sorted(entry["weights"]):
                raise ValueError(
                    f"LookaheadAblation: checkpoint weights of {point.name} do not match its module"
                )
            with torch.no_grad():
                for name, param in params.items():
                    param.copy_(entry["weights"][name])
            point.optimizer.load_state_dict(entry["optimizer"])
            point.scheduler.load_state_dict(entry["scheduler"])
