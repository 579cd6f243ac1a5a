"""Whole-command tests compare in-process runs with `lkv` subprocesses, which run one thread each
(`OMP_NUM_THREADS=1`, see `subprocess_env`). The in-process side runs one thread too, so both reduce in the
same order: with the machine's default thread count, losses drifted past rel 1e-4 within three steps."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
