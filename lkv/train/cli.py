"""`lkv fit|validate|test`: LightningCLI over :class:`LookaheadKVModule` and :class:`LabelDataModule`.

Configs have a ``model:`` (the module's arguments), a ``data:`` (the label folders) and a ``trainer:``
section; ``lkv fit --config configs/smollm2_135m.yaml --print_config`` shows every setting without
loading any weights. A config whose ``model:`` names a ``class_path`` (with its ``init_args``) trains that
:class:`~lkv.train.frozen.FrozenLLMModule` instead, e.g. the per-token probe of ``configs/probe_smollm2.yaml``
(:class:`lkv.train.probe_module.ProbeModule`); the LookaheadKV configs keep their plain ``model:`` settings.
TensorBoard is the default logger; every fit run carries an HParams session that ranks it by its last
``val/recall@C``, ``val/kendall_tau`` and ``val/kl``.

``lkv fit --config X.yaml --ckpt_path last`` is one command for a first run and for every restart after
an interruption: with no checkpoint yet it starts from scratch, otherwise it resumes from ``last.ckpt`` at
its global step, logging into the TensorBoard run folder (``version_N``) of the run it resumes (kept in every
checkpoint by :class:`TensorBoardRun`). Before anything is written, ``fit`` refuses to resume from a
checkpoint made with other model or data settings, and refuses a fresh run (no ``--ckpt_path``) into a
checkpoint folder that already holds checkpoints, so an earlier run is never overwritten. It warns about a
``ModelCheckpoint`` that saves every N training steps while monitoring a metric (:func:`deferred_step_saves`).

A config may include another: a top-level ``config: recipes/paper.yaml`` (relative to the including file)
is read first, and the including file's keys, nested or dotted (``model.model: Qwen/Qwen3-8B``), win.
Lists are replaced whole. :func:`resolved_fit_config` gives the merged result, as ``fit`` would run it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from collections.abc import Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lkv.core.progress import interactive
from lkv.train.datamodule import LabelDataModule
from lkv.train.export import read_checkpoint
from lkv.train.frozen import FrozenLLMModule
from lkv.train.module import LookaheadKVModule
from lkv.train.progress import FitProgressLines, bar_on_terminal_only


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a hidden file beside its final path, then renames it into place.

    Lightning's own write goes through a temporary file in the system temp folder; when that is another
    file system than the checkpoint folder (local ``/tmp``, shared checkpoints), the final step is a copy
    that a kill can cut short, leaving a truncated ``last.ckpt`` in place of the previous one. A rename
    within one folder is atomic. URLs (``s3://`` ...) keep Lightning's write.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)


class TensorBoardRun(L.Callback):
    """Keeps the TensorBoard run of a fit in its checkpoints: ``{"root_dir": absolute, "version": N}`` of the
    first TensorBoard logger, so that :class:`LookaheadCLI` resumes logging in that ``version_N`` folder."""

    def __init__(self) -> None:
        self.trainer: L.Trainer | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        logger = _tensorboard(self.trainer)
        if logger is None:
            return {}
        return {"root_dir": os.path.abspath(logger.root_dir), "version": logger.version}


class RunConfig(SaveConfigCallback):
    """LightningCLI's ``config.yaml`` in the run's log folder, but none from ``validate`` or ``test`` without a
    logger: they make no run folder, and the trainer's log folder is then the working directory (a fit writes
    its checkpoints under that folder too, so its config goes there as Lightning does)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.logger is None and stage != "fit":
            return
        super().setup(trainer, pl_module, stage)


def _tensorboard(trainer: L.Trainer | None) -> TensorBoardLogger | None:
    """The trainer's first TensorBoard logger, if any."""
    loggers = trainer.loggers if trainer is not None else []
    return next((logger for logger in loggers if isinstance(logger, TensorBoardLogger)), None)


# hyper-parameter → (its least value, whether that value itself is allowed, what it is): checked as the config
# enters, before any class is built or model loaded (a zero learning rate would train nothing, silently)
HPARAM_FLOORS: dict[str, tuple[float, bool, str]] = {
    "num_lookahead": (1, True, "lookahead tokens"),
    "optim.lr": (0.0, False, "a learning rate"),
    "optim.warmup_steps": (0, True, "steps"),
    "optim.weight_decay": (0.0, True, "a weight decay"),
    "optim.min_lr_ratio": (0.0, True, "a ratio of the learning rate"),
}
# sections of `model:` that hold settings of their own (the probe trained beside a lookahead module)
NESTED_SECTIONS = ("", "probe.")


def _setting(section: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` (``optim.lr``) inside ``section``, or None where any part is missing."""
    value: Any = section
    for part in dotted.split("."):
        if not hasattr(value, "get"):  # a dict, or jsonargparse's Namespace
            return None
        value = value.get(part)
    return value


def check_hparams(model: Mapping[str, Any]) -> None:
    """Refuse a ``model:`` section (its ``init_args`` when it names a class) with a value below its floor
    in :data:`HPARAM_FLOORS`, in the section itself or in the probe trained beside it, naming the key as the
    config writes it (``model.optim.lr``, ``model.probe.optim.lr`` or ``model.init_args.optim.lr``).

    Raises:
        ValueError: one line: the key, what it must be and the value found.
    """
    prefix = "model."
    if model.get("init_args") is not None:
        model, prefix = model["init_args"], "model.init_args."
    for section in NESTED_SECTIONS:
        for key, (floor, inclusive, what) in HPARAM_FLOORS.items():
            value = _setting(model, section + key)
            if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if value < floor or (value == floor and not inclusive):
                bound = f"≥ {floor}" if inclusive else f"> {floor}"
                raise ValueError(f"{prefix}{section}{key}: expected {what} {bound}, found {value}")


class LookaheadCLI(LightningCLI):
    """LightningCLI whose ``fit`` never overwrites or silently continues another run's checkpoints, and whose
    model settings are the ones given, whatever checkpoint ``--ckpt_path`` names."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parse ``args``, and keep apart the model settings they give explicitly (config files and flags, no
        defaults). LightningCLI (2.6) then replaces the model settings with a ``--ckpt_path`` file's
        hyper-parameters, silently dropping what was given (a ``validate`` at another budget, a resumed ``fit``
        with another learning rate); :meth:`before_instantiate_classes` lays the given ones back over them, so
        a resumed fit's settings are compared with the checkpoint's (:meth:`_check_same_run`) as they are
        with ``--ckpt_path last``."""
        super().parse_arguments(parser, args)
        self.given_model: dict[str, Any] | None = None
        if isinstance(args, list) and self.config.get("subcommand"):
            explicit = parser.parse_args(args, defaults=False)[self.config["subcommand"]]
            model = explicit.get("model")
            self.given_model = model.as_dict() if hasattr(model, "as_dict") else model

    def before_instantiate_classes(self) -> None:
        if self.subcommand and self.given_model:
            self.config = self.parser.parse_object(
                {self.subcommand: {"model": self.given_model}}, self.config
            )
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_hparams(config.get("model") or {})

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        bar_on_terminal_only(trainer)
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        """Run ``subcommand``; if it fails before its first optimizer step, remove the TensorBoard version
        folder it created (the saved config, empty event files): a failed start leaves no run to look at."""
        logger = self.trainer.logger
        # the folders there before: reading `logger.log_dir` now would fix the version before `before_fit` can
        # point a resumed fit at its own run's folder
        existing = None
        if isinstance(logger, TensorBoardLogger):
            root = Path(logger.root_dir)
            existing = set(root.iterdir()) if root.is_dir() else set()
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if existing is not None and self.trainer.global_step == 0:
                created = Path(logger.log_dir)
                if created.is_dir() and created not in existing:
                    shutil.rmtree(created)
            raise

    def before_fit(self) -> None:
        for warning in deferred_step_saves(self.trainer.checkpoint_callbacks):
            rank_zero_warn(warning)
        folders = [
            Path(callback.dirpath)
            for callback in self.trainer.checkpoint_callbacks
            if isinstance(callback, ModelCheckpoint) and callback.dirpath
        ]
        ckpt_path = self.config_init["fit"].get("ckpt_path")
        # Under SLURM, Lightning itself resumes from the `hpc_ckpt_N.ckpt` it saved on the requeue signal.
        hpc = (
            sorted(Path(self.trainer.default_root_dir).glob("hpc_ckpt_*.ckpt"))
            if SLURMEnvironment.detect()
            else []
        )
        if ckpt_path is None and not hpc:
            for folder in folders:
                found = sorted(p.name for p in folder.glob("*.ckpt"))
                if found:
                    raise ValueError(
                        f"ModelCheckpoint dirpath {folder}: expected an empty folder for a fresh run, found "
                        f"checkpoints of an earlier run ({', '.join(found[:3])}); resume it with --ckpt_path "
                        "last, or point the ModelCheckpoint dirpath elsewhere"
                    )
            return
        last = [
            folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
            for folder in folders
        ]
        candidates = {None: hpc, "hpc": hpc, "last": last}.get(ckpt_path, [Path(str(ckpt_path))])
        for path in candidates:
            if path.is_file():
                checkpoint = read_checkpoint(path)
                self._check_same_run(checkpoint, path)
                self._continue_run_folder(checkpoint)

    def _continue_run_folder(self, checkpoint: dict[str, Any]) -> None:
        """Log into the TensorBoard ``version_N`` folder that the checkpoint's run logged into
        (:class:`TensorBoardRun`), when this fit's TensorBoard logger has the same root folder and no version
        of its own."""
        run = checkpoint.get("callbacks", {}).get(TensorBoardRun.__qualname__, {})
        logger = _tensorboard(self.trainer)
        if not run or logger is None or os.path.abspath(logger.root_dir) != run["root_dir"]:
            return
        # TensorBoardLogger takes its version from `_version`, or the next free one when that is None
        if logger._version is None:
            logger._version = run["version"]

    def _check_same_run(self, checkpoint: dict[str, Any], path: Path) -> None:
        """Refuse to resume from ``checkpoint`` (read from ``path``) when it was written with other module or
        data settings. ``data.num_workers`` counts too: the training loader's position is kept per worker, and
        a streamed set's order depends on how its rows are split among the workers."""
        diffs = _differences(checkpoint.get("hyper_parameters", {}), self.model.hparams, "model.")
        if self.datamodule is not None and "datamodule_hyper_parameters" in checkpoint:
            saved = checkpoint["datamodule_hyper_parameters"]
            diffs += _differences(saved, self.datamodule.hparams, "data.")
        if diffs:
            raise ValueError(
                f"checkpoint {path} belongs to a different run: resuming needs the settings it was written "
                f"with; differences (checkpoint vs this run): {'; '.join(diffs)}. For a new run, point the "
                "ModelCheckpoint dirpath elsewhere"
            )


def deferred_step_saves(callbacks: list[Any]) -> list[str]:
    """One warning per ``ModelCheckpoint`` of ``callbacks`` that saves every N training steps and monitors a
    metric. Lightning (2.6) defers such a step's save, ``last.ckpt`` included, until the monitored metric has
    been logged, i.e. until the first validation: with validation at epoch ends a fit killed in its first epoch
    (out of memory, SIGKILL) keeps nothing. The fix is a second ``ModelCheckpoint`` that saves every N steps
    with ``save_last`` and no monitor."""
    return [
        f"ModelCheckpoint {callback.dirpath}: it saves every {callback._every_n_train_steps} training steps but "
        f"monitors {callback.monitor!r}, so Lightning saves nothing, last.ckpt included, until {callback.monitor!r} "
        "is first logged (the first validation): a fit killed before then keeps nothing. Add a second "
        "ModelCheckpoint with every_n_train_steps and save_last: true but no monitor (save_top_k: 0), and keep "
        "this one for the best checkpoint"
        for callback in callbacks
        if isinstance(callback, ModelCheckpoint) and callback.monitor and callback._every_n_train_steps
    ]


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str) -> list[str]:
    """``'prefix.key: saved vs current'`` for every key whose values differ (a tuple equals a list)."""

    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True, default=str)

    return [
        f"{prefix}{key}: {saved.get(key)!r} vs {current.get(key)!r}"
        for key in sorted(set(saved) | set(current))
        if canonical(saved.get(key)) != canonical(current.get(key))
    ]


def _configs(args: list[str]) -> list[dict[str, Any]]:
    """The contents of every ``--config`` file in ``args``, each followed by the files it includes
    (``config:``); files that do not exist are left to the parser to report."""
    given = [value for flag, value in zip(args, args[1:], strict=False) if flag == "--config"]
    given += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    found: list[dict[str, Any]] = []

    def visit(path: Path) -> None:
        content = yaml.safe_load(path.read_text()) if path.is_file() else None
        if isinstance(content, dict):
            found.append(content)
            includes = content.get("config")
            for include in [includes] if isinstance(includes, str) else includes or []:
                visit(path.parent / include)

    for path in given:
        visit(Path(path))
    return found


def names_module_class(args: list[str]) -> bool:
    """Whether ``args`` pick the LightningModule by class path: ``model: {class_path: ...}`` (or a dotted
    ``model.class_path:``) in a ``--config`` file or a file it includes, or a ``--model.class_path`` or
    ``--model`` argument."""
    for content in _configs(args):
        model = content.get("model")
        if "model.class_path" in content or (isinstance(model, dict) and "class_path" in model):
            return True
    return any(arg == "--model" or arg.startswith(("--model=", "--model.class_path")) for arg in args)


def lightning_main(args: list[str]) -> None:
    """Run LightningCLI with ``args`` (``["fit", "--config", "configs/X.yaml", ...]``).

    The module is :class:`LookaheadKVModule`, whose settings a config gives directly under ``model:``, unless
    the arguments name a class (:func:`names_module_class`): then any
    :class:`~lkv.train.frozen.FrozenLLMModule` given as ``model: {class_path: ..., init_args: ...}``.
    """
    by_class = names_module_class(args)
    try:
        _lightning_cli(args, by_class)
    except SystemExit as exit_:
        # Lightning ends a fit stopped by SIGTERM with SIGTERMException (exit status 0, as if it had finished)
        # and one stopped by Ctrl-C with sys.exit(1) raised while handling the KeyboardInterrupt. A scheduler
        # must see a pre-empted job as stopped, and the entry point prints what was kept and how to resume:
        # give both back as the signal they were.
        if isinstance(exit_, SIGTERMException):
            raise SystemExit(128 + signal.SIGTERM) from None
        if isinstance(exit_.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise


def _lightning_cli(args: list[str], by_class: bool) -> None:
    """LightningCLI over ``args``: the module class (or, ``by_class``, any FrozenLLMModule) and lkv's defaults."""
    LookaheadCLI(
        FrozenLLMModule if by_class else LookaheadKVModule,
        LabelDataModule,
        subclass_mode_model=by_class,
        args=args,
        seed_everything_default=0,
        save_config_callback=RunConfig,
        save_config_kwargs={"overwrite": True},
        # a bad key or value raises (the entry point makes it one line) instead of printing the whole usage
        parser_kwargs={"exit_on_error": False},
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                # the module names its own HParams metrics (LookaheadKVModule.on_fit_start)
                "init_args": {"save_dir": "runs", "default_hp_metric": False},
            },
            # a config that sets `trainer.plugins` replaces this: list AtomicCheckpointIO there too
            "plugins": {"class_path": "lkv.train.cli.AtomicCheckpointIO"},
            # added to the config's callbacks, never replaced by them: progress lines in a log file, the
            # TensorBoard run in checkpoints
            "callbacks": [FitProgressLines(), TensorBoardRun()],
            # the layer table (and its "Total FLOPs") on a terminal; a log file gets lkv's own lines
            "enable_model_summary": interactive(),
        },
    )


def resolved_fit_config(path: str | Path) -> dict[str, Any]:
    """The whole ``fit`` config that ``lkv fit --config path`` runs: includes merged, every default filled.

    Parsed by LightningCLI itself (``--print_config``), so it is exactly what a fit would use; no weights
    are loaded.

    Raises:
        ValueError: naming the file, with the parser's message, when it does not parse.
    """
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            lightning_main(["fit", "--config", str(path), "--print_config"])
    except ArgumentError as error:
        raise ValueError(f"{path}: {' '.join(str(error).split())}") from None
    except SystemExit as exit_info:
        if exit_info.code not in (0, None):
            raise ValueError(
                f"{path}: not a valid `lkv fit` config (see the parser's message above)"
            ) from None
    return yaml.safe_load(out.getvalue())
