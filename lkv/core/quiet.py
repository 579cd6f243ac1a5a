"""What the ``lkv`` entry point lets through to a terminal: lkv's own lines, progress bars and real warnings.

The libraries lkv builds on print notices that say nothing about a run: adverts, deprecations inside their
own code, notes on settings lkv chose on purpose. Each one is filtered here, by its message and category
(warnings) or its logger and message (log lines), with the reason next to it; nothing else is hidden, so
a new or unexpected warning still shows. ``LKV_VERBOSE=1`` switches every filter off.

Progress bars, the libraries' included (loading weights, writing a parquet shard, downloading a hub model),
are left alone on a terminal. Written to a file or a pipe a bar is a growing line of carriage returns, so
there the libraries' bars are switched off (:func:`quiet`; Lightning's in :mod:`lkv.train.progress`) and lkv
prints its own progress lines (:class:`lkv.core.progress.Progress`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

VERBOSE_ENV = "LKV_VERBOSE"

# (message regex matched at the start of the warning, category or a base class of it, why it is harmless)
HARMLESS_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        "torch deprecated LeafSpec; Lightning 2.6's own _pytree still builds one per batch",
    ),
    (
        r"`is_gradient_checkpointing` is deprecated",
        FutureWarning,
        "transformers 5 renamed the property; peft reads the old name when it wraps the backbone",
    ),
    (
        r"'set_vital' is deprecated",
        UserWarning,
        "torchdata 0.11's StatefulDataLoader calls a torch API that newer torch flags on every epoch",
    ),
    (
        r"Found \d+ module\(s\) in eval mode",
        UserWarning,  # Lightning's PossibleUserWarning
        "the frozen backbone stays in eval mode by design while the adapter trains",
    ),
    (
        r"The number of training batches \(\d+\) is smaller than the logging interval",
        UserWarning,  # Lightning's PossibleUserWarning
        "a short fit (a small demo, a test) logs at its end; nothing is lost",
    ),
    (
        r"Total length of `\w+` across ranks is zero",
        UserWarning,
        "a fit without `data.val` validates on an empty loader by design (empty training folders are refused)",
    ),
    (
        r"Checkpoint directory .* exists and is not empty",
        UserWarning,
        "every documented resume (`--ckpt_path last`) meets its own checkpoints; a fresh run into a folder "
        "of checkpoints is refused by lkv itself",
    ),
    (
        r"LightningCLI's args parameter is intended",
        UserWarning,
        "`lkv fit ...` hands LightningCLI the arguments after the verb, which sys.argv also holds",
    ),
)

# (logger, message regex, why it is harmless): informational lines of the libraries
HARMLESS_LOG_LINES: tuple[tuple[str, str, str], ...] = (
    (
        "lightning.pytorch.utilities.rank_zero",
        r"💡 Tip: .*(litlogger|litmodels)",
        "adverts for cloud services",
    ),
    (
        "lightning.pytorch.utilities.rank_zero",
        r"`Trainer.fit` stopped: `max_steps=",
        "the last `lkv fit: N/N steps` line says the fit reached its step count",
    ),
    (
        "lightning.pytorch.utilities.rank_zero",
        r"(GPU|TPU|HPU) available: False",
        "an accelerator this machine does not have (a present but unused one is a Lightning warning)",
    ),
    (
        "lightning.pytorch.utilities.rank_zero",
        r"Loading `train_dataloader` to estimate number of stepping batches",
        "the learning-rate schedule asks for the fit's step count before the loop opens its loader",
    ),
    ("lightning.fabric.utilities.seed", r"Seed set to", "the seed is in the config every fit saves"),
)

# environment variables that switch off the progress bars of huggingface_hub (and so transformers' weight
# loading) and datasets (parquet writing, split generation); read when those libraries are imported
LIBRARY_BARS_OFF = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def verbose() -> bool:
    """Whether ``LKV_VERBOSE`` asks to see everything (set and not ``0``/``false``/empty)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class _DropMessages(logging.Filter):
    """Drops the records of one logger whose message matches one of ``patterns``."""

    def __init__(self, patterns: list[str]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet() -> None:
    """Install the filters above in this process (idempotent; nothing when :func:`verbose`), and switch
    the libraries' progress bars off when standard error is no terminal (a variable the user set wins)."""
    if verbose():
        return
    if not sys.stderr.isatty():
        for name in LIBRARY_BARS_OFF:
            os.environ.setdefault(name, "1")
    for message, category, _ in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    by_logger: dict[str, list[str]] = {}
    for name, pattern, _ in HARMLESS_LOG_LINES:
        by_logger.setdefault(name, []).append(pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(patterns))
