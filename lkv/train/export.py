"""A training checkpoint → a standalone adapter or probe folder (the only place that reads ``.ckpt``).

The checkpoint holds only the trainable weights and the module's hyper-parameters; export rebuilds the
module on its base model (peft needs the model to name the LoRA weights), loads the weights and writes
:meth:`lkv.model.lookahead.LookaheadAdapter.save`'s folder, or :meth:`lkv.model.probe.ImportanceProbe.save`'s
for a probe checkpoint (:class:`lkv.train.probe_module.ProbeModule`, whose trainable weights are ``probe.*``).
A lookahead module trained with a probe beside it (``model.probe``) exports to one folder: the module's, with
the probe's folder in ``<folder>/probe/`` (:data:`PROBE_SUBFOLDER`) and the preset the pair is meant for in
``lookahead.json``'s ``extra["preset"]`` (``model.probe.preset``, default ``long``). ``extra["setting"]`` names
the prompt setting of the labels the module trained on (``aware`` or ``agnostic``).
Loading either folder back needs only the base model and no Lightning: ``LookaheadAdapter.load(folder,
base_model)`` or ``ImportanceProbe.load(folder, base_model)``, which is what the eviction and evaluation
stages do.

Only a checkpoint needs the LightningModules, so they (and Lightning) are imported when one is exported:
`lkv eval` and `lkv generate` given an adapter or probe folder never load Lightning.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lkv.model.lookahead import CONFIG_FILE, SETTING_KEY
from lkv.model.probe import PROBE_CONFIG_FILE, PROBE_SUBFOLDER

if TYPE_CHECKING:
    from lkv.model.lookahead import LookaheadAdapter
    from lkv.train.frozen import FrozenLLMModule
    from lkv.train.module import LookaheadKVModule

# `resolve_adapter` exports a checkpoint `X.ckpt` to the sibling folder `X-adapter/`, `resolve_probe`
# to `X-probe/`.
EXPORT_SUFFIX = "-adapter"
PROBE_EXPORT_SUFFIX = "-probe"


def read_checkpoint(ckpt: str | Path) -> dict[str, Any]:
    """The contents of a checkpoint file (memory-mapped, on the CPU).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file torch cannot read (truncated, or no checkpoint at all), named.
    """
    if not Path(ckpt).is_file():
        raise FileNotFoundError(f"checkpoint {str(ckpt)!r} not found")
    unreadable = "expected a checkpoint written by `lkv fit`, found an unreadable file"
    if not zipfile.is_zipfile(ckpt):  # torch.save writes a zip archive; its index is at the end
        raise ValueError(f"checkpoint {ckpt}: {unreadable} (no zip archive: cut short, or not a checkpoint)")
    try:
        return torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError ... for a damaged file
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"checkpoint {ckpt}: {unreadable} ({reason})") from None


def load_checkpoint(ckpt: str | Path, **overrides: str) -> FrozenLLMModule:
    """The LightningModule of an ``lkv fit`` checkpoint, its base model loaded (``overrides``: init args).

    A checkpoint whose weights are all ``probe.*`` is a :class:`ProbeModule`'s, all ``restore.*`` a
    :class:`~lkv.train.restore_module.RestoreKVModule`'s, any other (``adapter.*``, with or without a probe
    beside it) a :class:`LookaheadKVModule`'s.
    """
    from lkv.train.module import LookaheadKVModule
    from lkv.train.probe_module import ProbeModule
    from lkv.train.restore_module import RestoreKVModule

    state = read_checkpoint(ckpt).get("state_dict", {})
    probe_only = bool(state) and all(key.startswith("probe.") for key in state)
    restore_only = bool(state) and all(key.startswith("restore.") for key in state)
    module_class = ProbeModule if probe_only else RestoreKVModule if restore_only else LookaheadKVModule
    kept = {k: v for k, v in overrides.items() if v is not None}
    return module_class.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False, **kept)


def export_checkpoint(
    ckpt: str | Path, output: str | Path, model: str | None = None, dtype: str | None = None
) -> str:
    """Write a checkpoint's lookahead module (peft files + embeddings + ``lookahead.json``, and the probe
    trained beside it in ``output/probe``), probe (``probe.json`` + ``probe.safetensors``) or restore module
    (:mod:`lkv.model.restore`'s folder) to ``output``."""
    from lkv.train.probe_module import ProbeModule
    from lkv.train.restore_module import RestoreKVModule

    module = load_checkpoint(ckpt, model=model, dtype=dtype)
    if isinstance(module, RestoreKVModule):
        config = module.restore.config
        config.extra["model"] = module.hparams.model  # the folder names its base model
        config.extra[SETTING_KEY] = module.label_setting  # `lkv eval` warns when it runs in the other one
        module.restore.save(output)
        return (
            f"exported the n={config.num_tokens} restore module (lora: {config.target_modules}) to {output}"
        )
    if isinstance(module, ProbeModule):
        config = module.probe.config
        # the folder names its base model, so loading it needs no `--model`
        config.extra["model"] = module.hparams.model
        module.probe.save(output)
        kind = f"MLP hidden {config.hidden_dim}" if config.hidden_dim else "linear"
        return f"exported the {kind} probe ({config.num_layers} layers, target {config.target}) to {output}"
    return save_lookahead_folder(module, output)


def save_lookahead_folder(
    module: LookaheadKVModule, output: str | Path, adapter: LookaheadAdapter | None = None
) -> str:
    """Write ``adapter`` (default: ``module``'s own) as an ``lkv export`` folder in ``output``; returns what it wrote.

    The folder names its base model, so loading it needs no ``--model`` (``exported_base_model``), and the
    setting its labels were made for (``trained_setting``: ``lkv eval`` warns when it runs in the other one). A
    probe trained beside ``module`` goes into ``output/probe`` and the preset the pair is meant for into
    ``lookahead.json``'s ``extra["preset"]``. The probe learns from the labels alone, so an ablation's sibling
    modules (trained on the same labels in the same fit) are written with it too: each point is then the
    product's preset with only the module changed.
    """
    adapter = module.adapter if adapter is None else adapter
    adapter.config.extra["model"] = module.hparams.model
    adapter.config.extra[SETTING_KEY] = module.label_setting
    beside = ""
    if module.probe is not None:
        adapter.config.extra["preset"] = module.probe_settings.preset
        module.probe.config.extra["model"] = module.hparams.model
        module.probe.save(Path(output) / PROBE_SUBFOLDER)
        beside = (
            f" with its probe in {Path(output) / PROBE_SUBFOLDER} (preset {module.probe_settings.preset})"
        )
    adapter.save(output)
    config = adapter.config
    return (
        f"exported M={config.num_tokens} lookahead module (lora: {config.target_modules}) to {output}{beside}"
    )


def _exported(path: Path, suffix: str, marker: str, model: str | None, what: str) -> Path:
    """``path`` if it is a folder, else the checkpoint ``path`` exported (once, again when newer) to the
    sibling folder ``<stem><suffix>/`` whose ``marker`` file says it is done."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r}: neither an `lkv export` folder nor a checkpoint file")
    folder = path.with_name(path.stem + suffix)
    done = folder / marker
    if not done.is_file() or done.stat().st_mtime < path.stat().st_mtime:
        export_checkpoint(path, folder, model=model)
    return folder


def resolve_adapter(adapter: str | Path, model: str | None = None) -> Path:
    """An adapter folder for ``adapter``: the folder itself, or a ``.ckpt`` exported beside it (once).

    A checkpoint ``run/last.ckpt`` is exported to ``run/last-adapter/``, again whenever the checkpoint is
    newer than that folder, so commands that take either (``lkv eval``, ``lkv generate``) hand the
    eviction stage a folder.
    """
    return _exported(Path(adapter), EXPORT_SUFFIX, CONFIG_FILE, model, "adapter")


def resolve_probe(probe: str | Path, model: str | None = None) -> Path:
    """A probe folder for ``probe``: the folder itself, or a probe ``.ckpt`` exported to ``<stem>-probe/``
    (once, again whenever the checkpoint is newer), as :func:`resolve_adapter` does for adapters."""
    return _exported(Path(probe), PROBE_EXPORT_SUFFIX, PROBE_CONFIG_FILE, model, "probe")
