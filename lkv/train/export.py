"""`lkv export`: a training checkpoint → a standalone lookahead adapter folder.

The checkpoint holds only the trainable weights and the module's hyper-parameters; export rebuilds the
module on its base model (peft needs the model to name the LoRA weights), loads the weights and writes
:meth:`lkv.model.lookahead.LookaheadAdapter.save`'s folder. Loading that folder back needs only the base model:
``LookaheadAdapter.load(folder, base_model)``.
"""

from __future__ import annotations

from pathlib import Path

from lkv.train.module import LookaheadKVModule


def export(ckpt: str, output: str, model: str | None = None, dtype: str | None = None) -> str:
    """Write a trained lookahead module (peft adapter files + embeddings + ``lookahead.json``) to a folder.

    Args:
        ckpt: a checkpoint written by `lkv fit` (e.g. ``runs/smollm2_135m/checkpoints/last.ckpt``).
        output: folder to write (created; existing adapter files are overwritten).
        model: load the base model from here instead of the checkpoint's ``model`` (e.g. a local copy of
            the same hub model); it must be the same model.
        dtype: base model dtype while exporting (default: the checkpoint's); does not change the saved
            weights' dtype (``bfloat16`` keeps an 8B model within 16 GB of CPU memory).
    """
    if not Path(ckpt).is_file():
        raise FileNotFoundError(f"checkpoint {ckpt!r} not found")
    overrides = {k: v for k, v in {"model": model, "dtype": dtype}.items() if v is not None}
    module = LookaheadKVModule.load_from_checkpoint(ckpt, map_location="cpu", weights_only=False, **overrides)
    module.adapter.save(output)
    config = module.adapter.config
    return f"exported M={config.num_tokens} lookahead module (lora: {config.target_modules}) to {output}"
