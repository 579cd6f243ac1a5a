"""`lkv export`: a training checkpoint → a standalone adapter (LookaheadKV) or probe folder."""

from __future__ import annotations


def export(ckpt: str, output: str, model: str | None = None, dtype: str | None = None) -> str:
    """Write the trained lookahead module or probe of an `lkv fit` checkpoint as a standalone folder.

    The folder holds a lookahead module (peft adapter files, embeddings and ``lookahead.json``, for
    ``--adapter``) or a per-token probe (``probe.json`` and ``probe.safetensors``, for ``--probe``), whichever
    the checkpoint holds.

    Args:
        ckpt: a checkpoint written by `lkv fit` (e.g. ``runs/smollm2_135m/checkpoints/last.ckpt``).
        output: folder to write (created; existing files of the same names are overwritten).
        model: load the base model from here instead of the checkpoint's ``model`` (e.g. a local copy of
            the same hub model); it must be the same model.
        dtype: base model dtype while exporting (default: the checkpoint's); does not change the saved
            weights' dtype (``bfloat16`` keeps an 8B model within 16 GB of CPU memory).
    """
    from lkv.train.export import export_checkpoint  # after parsing: `--help` loads no torch

    return export_checkpoint(ckpt, output, model=model, dtype=dtype)
