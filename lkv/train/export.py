"""A training checkpoint → a standalone lookahead adapter folder (the only place that reads ``.ckpt``).

The checkpoint holds only the trainable weights and the module's hyper-parameters; export rebuilds the
module on its base model (peft needs the model to name the LoRA weights), loads the weights and writes
:meth:`lkv.model.lookahead.LookaheadAdapter.save`'s folder. Loading that folder back needs only the base
model and no Lightning: ``LookaheadAdapter.load(folder, base_model)``, which is what the eviction and
evaluation stages do.
"""

from __future__ import annotations

from pathlib import Path

from lkv.train.module import LookaheadKVModule

# `resolve_adapter` exports a checkpoint `X.ckpt` to this sibling folder `X-adapter/`.
EXPORT_SUFFIX = "-adapter"


def load_checkpoint(ckpt: str | Path, **overrides: str) -> LookaheadKVModule:
    """The LightningModule of an ``lkv fit`` checkpoint, its base model loaded (``overrides``: init args)."""
    if not Path(ckpt).is_file():
        raise FileNotFoundError(f"checkpoint {str(ckpt)!r} not found")
    kept = {k: v for k, v in overrides.items() if v is not None}
    return LookaheadKVModule.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False, **kept)


def export_checkpoint(
    ckpt: str | Path, output: str | Path, model: str | None = None, dtype: str | None = None
) -> str:
    """Write a checkpoint's lookahead module (peft files + embeddings + ``lookahead.json``) to ``output``."""
    module = load_checkpoint(ckpt, model=model, dtype=dtype)
    # the folder names its base model, so loading it needs no `--model` (`exported_base_model`)
    module.adapter.config.extra["model"] = module.hparams.model
    module.adapter.save(output)
    config = module.adapter.config
    return f"exported M={config.num_tokens} lookahead module (lora: {config.target_modules}) to {output}"


def resolve_adapter(adapter: str | Path, model: str | None = None) -> Path:
    """An adapter folder for ``adapter``: the folder itself, or a ``.ckpt`` exported beside it (once).

    A checkpoint ``run/last.ckpt`` is exported to ``run/last-adapter/``, again whenever the checkpoint is
    newer than that folder, so commands that take either (``lkv eval``, ``lkv generate``) hand the
    eviction stage a folder.
    """
    path = Path(adapter)
    if path.is_dir():
        return path
    if not path.is_file():
        raise FileNotFoundError(
            f"adapter {str(adapter)!r}: neither an `lkv export` folder nor a checkpoint file"
        )
    folder = path.with_name(path.stem + EXPORT_SUFFIX)
    marker = folder / "lookahead.json"
    if not marker.is_file() or marker.stat().st_mtime < path.stat().st_mtime:
        export_checkpoint(path, folder, model=model)
    return folder
