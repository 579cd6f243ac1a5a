"""The terminal filters hide exactly the listed notices: other warnings and log lines still show, and
`LKV_VERBOSE=1` turns every filter off."""

from __future__ import annotations

import logging
import warnings

import pytest

from lkv.core import quiet as quiet_module
from lkv.core.quiet import HARMLESS_LOG_LINES, HARMLESS_WARNINGS, quiet

RANK_ZERO = "lightning.pytorch.utilities.rank_zero"


@pytest.fixture
def filters():
    """The process's warning filters and the rank-zero logger's filters, none of lkv's, restored afterwards."""
    logger = logging.getLogger(RANK_ZERO)
    before = list(logger.filters)
    # an earlier in-process `lkv` command of the test session may have installed them already
    logger.filters[:] = [f for f in before if not isinstance(f, quiet_module._DropMessages)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    logger.filters[:] = before


def shown_lines(logger: logging.Logger, messages: list[str]) -> list[str]:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for message in messages:
            logger.info(message)
    finally:
        logger.removeHandler(handler)
    return records


def test_the_listed_warnings_are_hidden_and_others_still_show(filters, monkeypatch):
    monkeypatch.delenv("LKV_VERBOSE", raising=False)
    quiet()
    warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
    warnings.warn(
        "`is_gradient_checkpointing` is deprecated and will be removed", FutureWarning, stacklevel=1
    )
    warnings.warn("Found 2039 module(s) in eval mode at the start of training.", UserWarning, stacklevel=1)
    warnings.warn("'set_vital' is deprecated, please do not call", UserWarning, stacklevel=1)
    # the same text under another category, and a real warning, still show
    warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed", UserWarning, stacklevel=1)
    warnings.warn("checkpoint folder is not empty", UserWarning, stacklevel=1)
    assert [str(w.message)[:30] for w in filters] == [
        "`is_gradient_checkpointing` is",
        "checkpoint folder is not empty",
    ]


def test_the_listed_log_lines_are_hidden_and_others_still_show(filters, monkeypatch):
    monkeypatch.delenv("LKV_VERBOSE", raising=False)
    quiet()
    quiet()  # idempotent: one filter on the logger
    logger = logging.getLogger(RANK_ZERO)
    assert sum(isinstance(f, quiet_module._DropMessages) for f in logger.filters) == 1
    messages = [
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger](...)",
        "GPU available: False, used: False",
        "TPU available: False, using: 0 TPU cores",
        "GPU available: True (cuda), used: True",
        "`Trainer.fit` stopped: `max_epochs=3` reached.",
    ]
    assert shown_lines(logger, messages) == messages[3:]


def test_lkv_verbose_leaves_everything(filters, monkeypatch):
    monkeypatch.setenv("LKV_VERBOSE", "1")
    quiet()
    warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
    assert len(filters) == 1
    assert not any(isinstance(f, quiet_module._DropMessages) for f in logging.getLogger(RANK_ZERO).filters)


def test_every_filter_gives_its_reason():
    assert all(reason for *_, reason in HARMLESS_WARNINGS + HARMLESS_LOG_LINES)
