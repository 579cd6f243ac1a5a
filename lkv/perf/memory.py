"""Peak memory of one run of a benchmark case, free of earlier measurements.

GPU: the CUDA caching allocator's own statistics, in process — ``max_memory_allocated`` after
``reset_peak_memory_stats``, minus what was allocated before the run. It counts live tensor bytes, so earlier
runs and the allocator's cached blocks do not pollute it.

CPU: there is no such counter, and the process's resident set is polluted by earlier work (glibc keeps freed
heap pages; the high-water mark only ever rises). So each CPU measurement runs in a **fresh subprocess**
(``python -m lkv.perf.memory SPEC``) that

1. builds the case (loads the model, prepares inputs) and runs it once — one-time allocations (kernel
   caches, lazily built buffers) then belong to the set-up, not to the measured run (their size is
   reported separately as ``retained_bytes``);
2. frees what it can: ``gc.collect()`` and glibc's ``malloc_trim(0)``, which hands free heap pages of every
   arena back to the kernel;
3. resets the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``, Linux ≥ 4.0) and reads the
   resident set ``VmRSS`` as the baseline;
4. runs the case once more and reports ``VmHWM − baseline``: the most resident memory the run added on top
   of its set-up (activations, caches, gradients, allocator slack), in bytes.

Where ``clear_refs`` cannot be written, step 3 skips the reset; the warm-up of step 1 did the same work, so
the high-water mark is then still the run's own peak as long as the set-up peaked lower.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from lkv.perf.timing import Case

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESULT_PREFIX = "lkv-peak-memory "


def cuda_peak_bytes(case: Case, device: torch.device) -> int:
    """Bytes allocated on ``device`` at the peak of one run of ``case``, above what was allocated before it."""
    case.reset()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    case.run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def subprocess_peak_bytes(
    target: str, kwargs: dict[str, Any], threads: int, timeout: float | None = None
) -> dict:
    """Peak resident bytes of one run of the case ``target(**kwargs)`` in a fresh CPU subprocess.

    Args:
        target: ``"module:function"`` returning a :class:`~lkv.perf.timing.Case`; ``kwargs`` must be JSON.
        threads: ``torch.set_num_threads`` in the subprocess (use the parent's, for comparable runs).

    Returns:
        ``{"peak_bytes", "baseline_rss_bytes", "retained_bytes", "hwm_reset"}``: ``retained_bytes`` is what
        the warm-up run left resident (caches, lazily built buffers; not part of ``peak_bytes``),
        ``hwm_reset`` whether the kernel counter could be reset (see the module docstring).
    """
    spec = json.dumps({"target": target, "kwargs": kwargs, "threads": threads})
    proc = subprocess.run(
        [sys.executable, "-m", "lkv.perf.memory", spec], capture_output=True, text=True, timeout=timeout
    )
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT_PREFIX):
            return json.loads(line[len(_RESULT_PREFIX) :])
    raise RuntimeError(
        f"memory measurement of {target}({kwargs}) failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}"
    )


def calibration_case(mebibytes: int) -> Case:
    """A case whose run allocates and touches exactly ``mebibytes`` MiB (to check the method itself)."""

    def run() -> None:
        block = torch.empty(mebibytes * 2**20, dtype=torch.uint8)
        block.fill_(1)  # touch every page: untouched pages are not resident
        del block

    return Case(run=run)


def _status_bytes(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{_STATUS} has no {field} line")


def _release_free_memory() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_high_water_mark() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec["threads"])
    module, _, name = spec["target"].partition(":")
    case: Case = getattr(importlib.import_module(module), name)(**spec["kwargs"])
    case.reset()
    _release_free_memory()
    before_warmup = _status_bytes("VmRSS")
    case.run()
    case.reset()
    _release_free_memory()
    reset = _reset_high_water_mark()
    baseline = _status_bytes("VmRSS")
    case.run()
    return {
        "peak_bytes": _status_bytes("VmHWM") - baseline,
        "baseline_rss_bytes": baseline,
        "retained_bytes": baseline - before_warmup,
        "hwm_reset": reset,
    }


if __name__ == "__main__":
    if not _STATUS.is_file():
        raise SystemExit("lkv.perf.memory measures CPU memory through /proc/self/status (Linux only)")
    print(_RESULT_PREFIX + json.dumps(_measure(json.loads(sys.argv[1]))), flush=True)
