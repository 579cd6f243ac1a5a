"""Exported adapter and probe folders follow the umask like any new file (safetensors alone writes 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from lkv.model.lookahead import LookaheadAdapter
from lkv.model.probe import ImportanceProbe


@pytest.fixture(params=[0o022, 0o077])
def mask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def modes(folder) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}


def test_an_adapter_folder_follows_the_umask(tiny_llama, mask, tmp_path):
    model, _ = tiny_llama
    LookaheadAdapter.create(model, num_tokens=2, init="random_tokens").save(tmp_path / "adapter")
    found = modes(tmp_path / "adapter")
    assert "adapter_model.safetensors" in found
    assert found == dict.fromkeys(found, 0o666 & ~mask)


def test_a_probe_folder_follows_the_umask(tiny_llama, mask, tmp_path):
    model, _ = tiny_llama
    ImportanceProbe.create(model, hidden_dim=0).save(tmp_path / "probe")
    found = modes(tmp_path / "probe")
    assert "probe.safetensors" in found
    assert found == dict.fromkeys(found, 0o666 & ~mask)
