"""The sub-benchmarks of ``lkv bench``, one module each, by the name ``--which`` gives them (in run order)."""

from lkv.perf.suites.base import Suite
from lkv.perf.suites.decode import Decode
from lkv.perf.suites.label import Label
from lkv.perf.suites.prefill_memory import PrefillMemory
from lkv.perf.suites.train_step import TrainStep
from lkv.perf.suites.ttft import TimeToFirstToken

SUITES: dict[str, Suite] = {
    suite.name: suite for suite in (TrainStep(), TimeToFirstToken(), Label(), Decode(), PrefillMemory())
}
