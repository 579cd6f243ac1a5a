"""The one wall clock of lkv's timings: ``perf_counter`` once the device has finished its queued work.

CUDA kernels run asynchronously: without a synchronisation a timer measures how long it took to *queue*
the work. The Compressor's TTFT, ``lkv eval``'s prefill/score seconds and ``lkv bench`` all read this clock.
"""

from __future__ import annotations

import time

import torch


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` in seconds after ``device`` (when CUDA) has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
