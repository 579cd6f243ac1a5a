"""LightningDataModule over label folders written by `lkv label`.

Each batch is a list of samples (variable prompt lengths, no padding): ``{"id": str, "prompt_ids": (S,)
long, "response_ids": (R,) long, "scores": (layers, kv_heads, S) float32 or None}``. ``scores`` is None for
a responses-only folder (``store_scores=False``); the module then computes the ground truth online.

Loaders are torchdata ``StatefulDataLoader``s, whose position Lightning saves in every checkpoint: a run
resumed from a mid-epoch checkpoint continues with the next unseen batch instead of restarting the epoch.
The training order is a seeded permutation per epoch, or the stored order with ``shuffle=False``
(``DistributedSampler``, to which Lightning passes the epoch), so it is the same after a restart and splits
over the ranks under DDP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from lkv.labels.shards import LabelMeta, load_labels, read_meta, row_scores
from lkv.model.backbone import ModelSignature, check_compatible

Sample = dict[str, Any]


class LabelCollate:
    """Rows of one label folder → list of :data:`Sample` (picklable, so it runs in loader workers)."""

    def __init__(self, meta: LabelMeta, folder: str) -> None:
        self.meta = meta
        self.folder = folder

    def __call__(self, rows: list[dict[str, Any]]) -> list[Sample]:
        return [
            {
                "id": row["id"],
                "prompt_ids": torch.tensor(row["prompt_ids"], dtype=torch.long),
                "response_ids": torch.tensor(row["response_ids"], dtype=torch.long),
                "scores": row_scores(row, self.meta, self.folder) if self.meta.store_scores else None,
            }
            for row in rows
        ]


class LabelDataModule(L.LightningDataModule):
    """Train / validation / test label folders, map-style or streamed with HF ``datasets``.

    Args:
        train: label folder for training.
        val: label folder for validation (held-out documents); None disables validation data.
        test: label folder for ``lkv test``; None falls back to ``val``.
        streaming: read shards lazily (label sets larger than memory); then shuffling uses a buffer.
        batch_size: samples per batch; each sample runs its own forward, so 1 plus the Trainer's
            ``accumulate_grad_batches`` is the usual way to an effective batch.
        num_workers: DataLoader worker processes (decoding parquet rows and reshaping scores).
        shuffle: shuffle the training set each epoch.
        seed: shuffling seed.
        shuffle_buffer: samples held for shuffling in streaming mode.
    """

    def __init__(
        self,
        train: str,
        val: str | None = None,
        test: str | None = None,
        streaming: bool = False,
        batch_size: int = 1,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1000,
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.save_hyperparameters()
        self.folders = {"train": train, "val": val, "test": test or val}
        self.datasets: dict[str, Dataset | IterableDataset] = {}
        self.metas: dict[str, LabelMeta] = {}

    def meta(self, split: str) -> LabelMeta | None:
        """The ``meta.json`` of a split's folder (read once), or None when the split has no folder."""
        folder = self.folders[split]
        if folder is None:
            return None
        if split not in self.metas:
            self.metas[split] = read_meta(folder)
        return self.metas[split]

    def check_model(self, signature: ModelSignature) -> None:
        """Fail unless every configured label folder was made by a model like ``signature``.

        Raises:
            ValueError: naming the folder, the model that labelled it and the loaded one.
        """
        for split, folder in self.folders.items():
            meta = self.meta(split)
            if meta is not None:
                expected = ModelSignature.from_dict(meta.model)
                check_compatible(expected, signature, f"label folder {folder} ({split})")

    def setup(self, stage: str) -> None:
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
        for split in splits:
            if self.folders[split] is not None and split not in self.datasets:
                self.datasets[split] = self._open(split)

    def _open(self, split: str) -> Dataset | IterableDataset:
        folder = Path(self.folders[split])
        self.meta(split)
        data = load_labels(folder, streaming=self.hparams.streaming)
        if isinstance(data, IterableDataset):
            if split == "train" and self.hparams.shuffle:
                data = data.shuffle(seed=self.hparams.seed, buffer_size=self.hparams.shuffle_buffer)
            if self.trainer is not None and self.trainer.world_size > 1:
                # Map-style sets get Lightning's DistributedSampler; streams are split by node here.
                data = split_dataset_by_node(data, self.trainer.global_rank, self.trainer.world_size)
        return data

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle a streamed training set for ``epoch`` (map-style sets reshuffle through their sampler)."""
        data = self.datasets.get("train")
        if isinstance(data, IterableDataset):
            data.set_epoch(epoch)

    def _loader(self, split: str, shuffle: bool) -> StatefulDataLoader:
        if split not in self.datasets:
            raise RuntimeError(f"no {split} label folder configured (data.{split})")
        data = self.datasets[split]
        sampler = None
        if split == "train" and not isinstance(data, IterableDataset):
            # Our own sampler: Lightning would otherwise inject a shuffling one under DDP whatever
            # `data.shuffle` says.
            trainer = self.trainer
            sampler = DistributedSampler(
                data,
                num_replicas=trainer.world_size if trainer is not None else 1,
                rank=trainer.global_rank if trainer is not None else 0,
                shuffle=shuffle,
                seed=self.hparams.seed,
            )
        workers = self.hparams.num_workers
        return StatefulDataLoader(
            data,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            collate_fn=LabelCollate(self.meta(split), str(self.folders[split])),
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    def train_dataloader(self) -> StatefulDataLoader:
        return self._loader("train", self.hparams.shuffle)

    def val_dataloader(self) -> StatefulDataLoader | list:
        # No validation folder: an empty list makes Lightning skip validation.
        return self._loader("val", False) if "val" in self.datasets else []

    def test_dataloader(self) -> StatefulDataLoader:
        return self._loader("test", False)
