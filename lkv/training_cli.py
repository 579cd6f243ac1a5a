"""`lkv fit|validate|test`: LightningCLI over :class:`LookaheadKVModule` and :class:`LabelDataModule`.

Configs have a ``model:`` (the module's arguments), a ``data:`` (the label folders) and a ``trainer:``
section; ``lkv fit --config configs/smollm2_135m.yaml --print_config`` shows every setting without
loading any weights. TensorBoard is the default logger.
"""

from __future__ import annotations

import warnings

from lightning.pytorch.cli import LightningCLI

from lkv.data.datamodule import LabelDataModule
from lkv.module import LookaheadKVModule


def lightning_main(args: list[str]) -> None:
    """Run LightningCLI with ``args`` (``["fit", "--config", "configs/X.yaml", ...]``)."""
    # The frozen LLM stays in eval mode by design while the adapter trains.
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
    # `lkv fit ...` hands LightningCLI the arguments after the verb, which sys.argv also holds.
    warnings.filterwarnings("ignore", message=r"LightningCLI's args parameter is intended")
    LightningCLI(
        LookaheadKVModule,
        LabelDataModule,
        args=args,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": "runs"},
            }
        },
    )
