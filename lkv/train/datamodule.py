"""LightningDataModule over label folders written by `lkv label`.

Each batch is a list of samples (variable prompt lengths, no padding): ``{"id": str, "prompt_ids": (S,)
long, "response_ids": (R,) long, "scores": (layers, kv_heads, S) float32 or None}``. ``scores`` is None for
a responses-only folder (``store_scores=False``); the module then computes the ground truth online.

Training may mix several label folders (one per prompt source, each with its own ``meta.json``), with
optional sampling weights (:mod:`lkv.labels.mix`). Under DDP every rank gets exactly the same number of
batches per epoch, map-style or streamed, whatever the row counts; the few rows that do not divide evenly
are left out of that epoch.

Loaders are torchdata ``StatefulDataLoader``s. The training loader (:class:`LabelLoader`) keeps its epoch
in its state, and the DataModule keeps that state in every checkpoint too
(:meth:`LabelDataModule.state_dict`), so a resumed fit trains exactly the batches an uninterrupted one
would: from a mid-epoch checkpoint the rest of that epoch, from one written after an epoch's last batch the
next epoch. The training order is a seeded plan per epoch (or the stored order with ``shuffle=False``),
rebuilt from the seed and the epoch.

``limit_train_samples: N`` trains on the first ``N`` rows of each train folder by sample id
(:func:`lkv.labels.mix.first_by_id`), a data-scaling study's nested subsets (the first 64 ⊂ the first 128
⊂ …): the subset depends only on the folder's ids, never on the seed, shuffling, world size or shard
layout; shuffling and DDP sharding then act on the subset.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lkv.labels.mix import (
    SOURCE_KEY,
    LabelSource,
    MixedLabels,
    MixSampler,
    StreamedLabels,
    check_same_model,
    check_same_setting,
    epoch_quotas,
)
from lkv.labels.shards import LabelMeta, row_scores
from lkv.model.backbone import ModelSignature, check_compatible

Sample = dict[str, Any]


class LabelCollate:
    """Rows of label sources → list of :data:`Sample` (picklable, so it runs in loader workers).

    Args:
        sources: ``(meta, folder)`` per source; a row's ``_source`` index picks its own.
    """

    def __init__(self, sources: list[tuple[LabelMeta, str]]) -> None:
        self.sources = sources

    def __call__(self, rows: list[dict[str, Any]]) -> list[Sample]:
        samples = []
        for row in rows:
            meta, folder = self.sources[row[SOURCE_KEY]]
            samples.append(
                {
                    "id": row["id"],
                    "prompt_ids": torch.as_tensor(row["prompt_ids"], dtype=torch.long),
                    "response_ids": torch.as_tensor(row["response_ids"], dtype=torch.long),
                    "scores": row_scores(row, meta, folder) if meta.store_scores else None,
                }
            )
        return samples


class LabelLoader(StatefulDataLoader):
    """The training loader: torchdata's ``StatefulDataLoader`` whose state also names the epoch it reads.

    Lightning saves the loader's state in checkpoints (and :class:`LabelDataModule` does as well) and loads it
    into the loader before iterating. The state is ``{"epoch": e, "loader": torchdata's state}`` while epoch
    ``e`` is under way and ``{"epoch": e + 1, "loader": {}}`` once its last batch was handed out. Loading it
    sets the epoch of ``epochs`` (the sampler or the stream) before anything is read, so the position is
    replayed on that epoch's plan, and an epoch that was complete is not replayed as an empty one.

    Args:
        epochs: what the epoch reshuffles (:class:`MixSampler` or :class:`StreamedLabels`).
        kwargs: ``StatefulDataLoader``'s.
    """

    def __init__(
        self, data: MixedLabels | StreamedLabels, epochs: MixSampler | StreamedLabels, **kwargs: Any
    ) -> None:
        super().__init__(data, **kwargs)
        self.epochs = epochs

    def state_dict(self) -> dict[str, Any]:
        # `_num_yielded`: the batches the current iterator has handed out (torch's DataLoader iterator)
        if self._iterator is not None and self._iterator._num_yielded >= len(self):
            return {"epoch": self.epochs.epoch + 1, "loader": {}}
        return {"epoch": self.epochs.epoch, "loader": super().state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Set the epoch of ``state_dict``, then torchdata's position in it. A checkpoint written before the
        epoch was kept holds torchdata's state alone: that position is loaded as it is.

        Raises:
            ValueError: a ``loader`` state whose ``epoch`` is not a non-negative integer.
        """
        if "loader" not in state_dict:
            super().load_state_dict(state_dict)
            return
        epoch = state_dict.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(
                f"training loader state: expected a non-negative integer 'epoch', found {epoch!r}"
            )
        self.epochs.set_epoch(epoch)
        super().load_state_dict(state_dict["loader"])


# What a streamed shuffle buffer may hold per DataLoader worker when `data.shuffle_buffer_mib` is not set (None
# keeps checkpoints written before the setting existed resumable).
DEFAULT_SHUFFLE_MIB = 1024


class LabelDataModule(L.LightningDataModule):
    """Train / validation / test label folders, map-style or streamed.

    Args:
        train: label folder for training, or several (one per prompt source: the paper's mix), each
            labelled by its own ``lkv label`` run with the same model.
        weights: sampling weight per train folder (None: every row once per epoch). An epoch keeps its
            length (the total row count) and draws ``rows · w_i / Σw`` rows from folder ``i``: a fresh
            subset each epoch below its size, repeats above.
        val: label folder for validation (held-out documents); None disables validation data.
        test: label folder for ``lkv test``; None falls back to ``val``.
        streaming: read shards lazily, a few rows at a time (label sets larger than memory); then
            shuffling permutes the shards and uses a buffer.
        batch_size: samples per batch; each sample runs its own forward, so 1 plus the Trainer's
            ``accumulate_grad_batches`` is the usual way to an effective batch.
        num_workers: DataLoader worker processes (decoding parquet rows and reshaping scores).
        shuffle: shuffle the training set each epoch.
        seed: shuffling seed.
        shuffle_buffer: samples held for shuffling in streaming mode (per DataLoader worker).
        shuffle_buffer_mib: the most MiB of rows that buffer holds per worker; None: 1024. With stored scores
            a 16K-token row of a 32-layer, 8-KV-head model is 16 MiB, so this bound, not ``shuffle_buffer``,
            sets how many rows are shuffled together (64 such rows; 2000 would be 32 GiB per worker).
        limit_train_samples: train on each train folder's first ``N`` rows by sample id only (for built-in
            prompts: the source's first ``N`` prompts); None: every row. Map-style only.
    """

    def __init__(
        self,
        train: str | list[str],
        weights: list[float] | None = None,
        val: str | None = None,
        test: str | None = None,
        streaming: bool = False,
        batch_size: int = 1,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        shuffle_buffer_mib: int | None = None,
        limit_train_samples: int | None = None,
    ) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        for name, value in (("shuffle_buffer", shuffle_buffer), ("shuffle_buffer_mib", shuffle_buffer_mib)):
            if value is not None and value <= 0:
                raise ValueError(f"data.{name} must be positive, got {value}")
        if limit_train_samples is not None:
            if limit_train_samples <= 0:
                raise ValueError(f"data.limit_train_samples must be positive, got {limit_train_samples}")
            if streaming:
                # a streamed rank reads its own contiguous slice of shards; a subset by id would need every id
                raise ValueError("data.limit_train_samples needs map-style data (data.streaming: false)")
        self.save_hyperparameters()
        train_folders = [train] if isinstance(train, str) else list(train)
        if not train_folders:
            raise ValueError("data.train: expected a label folder or a list of them, got an empty list")
        if weights is not None:
            epoch_quotas([1] * len(train_folders), weights)  # checks the weights before anything is read
        self.folders: dict[str, list[str]] = {
            "train": train_folders,
            "val": [val] if val is not None else [],
            "test": [test or val] if (test or val) is not None else [],
        }
        self.sources: dict[str, list[LabelSource]] = {}
        self.datasets: dict[str, MixedLabels | StreamedLabels] = {}
        # a checkpoint's training loader state, for the next training loader built (`load_state_dict`)
        self._train_state: dict[str, Any] | None = None

    def _sources(self, split: str) -> list[LabelSource]:
        """A split's folders with their metadata and shard row counts (read once)."""
        if split not in self.sources:
            self.sources[split] = [LabelSource.open(folder) for folder in self.folders[split]]
            if split == "train":
                check_same_model(self.sources[split])
        return self.sources[split]

    def check_model(self, signature: ModelSignature) -> None:
        """Fail unless every configured label folder was made by a model like ``signature``.

        Raises:
            ValueError: naming the folder, the model that labelled it and the loaded one.
        """
        for split in self.folders:
            for source in self._sources(split):
                expected = ModelSignature.from_dict(source.meta.model)
                check_compatible(expected, signature, f"label folder {source.folder} ({split})")

    def label_setting(self) -> str:
        """The prompt setting (``aware``, ``agnostic``) of every configured label folder's labels.

        Raises:
            ValueError: folders of both settings (:func:`lkv.labels.mix.check_same_setting`).
        """
        return check_same_setting([source for split in self.folders for source in self._sources(split)])

    def setup(self, stage: str) -> None:
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ())
        for split in splits:
            if self.folders[split] and split not in self.datasets:
                self.datasets[split] = self._open(split)

    def _world(self) -> tuple[int, int]:
        """``(rank, world size)`` of the attached trainer (``(0, 1)`` without one)."""
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _limit(self, split: str) -> int | None:
        """Rows kept per folder of ``split`` (``data.limit_train_samples`` for train), checked against each
        folder's row count; None: all.

        Raises:
            ValueError: naming the folder, the rows it holds and the limit, when it holds fewer.
        """
        limit = self.hparams.limit_train_samples if split == "train" else None
        if limit is not None:
            for source in self._sources(split):
                if source.rows < limit:
                    raise ValueError(
                        f"data.limit_train_samples={limit}: label folder {source.folder} holds only "
                        f"{source.rows} rows; label at least {limit} prompts there or lower the limit"
                    )
        return limit

    def _quotas(self, split: str) -> list[int]:
        limit = self._limit(split)
        rows = [source.rows if limit is None else limit for source in self._sources(split)]
        return epoch_quotas(rows, self.hparams.weights if split == "train" else None)

    def _open(self, split: str) -> MixedLabels | StreamedLabels:
        sources = self._sources(split)
        if not self.hparams.streaming:
            return MixedLabels(sources, self._limit(split))
        rank, world = self._world()
        hp = self.hparams
        shuffle = split == "train" and hp.shuffle
        mib = DEFAULT_SHUFFLE_MIB if hp.shuffle_buffer_mib is None else hp.shuffle_buffer_mib
        quotas = self._quotas(split)
        return StreamedLabels(sources, quotas, rank, world, shuffle, hp.seed, hp.shuffle_buffer, mib * 2**20)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle a streamed training set for ``epoch`` (map-style sets reshuffle through their sampler)."""
        data = self.datasets.get("train")
        if isinstance(data, StreamedLabels):
            data.set_epoch(epoch)

    def _loader(self, split: str, shuffle: bool) -> StatefulDataLoader:
        if split not in self.datasets:
            raise RuntimeError(f"no {split} label folder configured (data.{split})")
        data = self.datasets[split]
        sampler = None
        if isinstance(data, MixedLabels):
            # Our own DistributedSampler, so Lightning injects none (its own would shuffle under DDP whatever
            # `data.shuffle` says, and pad uneven ranks with repeated samples).
            rank, world = self._world()
            sampler = MixSampler(data, self._quotas(split), world, rank, shuffle, self.hparams.seed)
            if len(sampler) == 0:
                raise ValueError(
                    f"data.{split}: {len(data)} rows cannot be split over {world} ranks (each needs one)"
                )
        workers = self.hparams.num_workers
        sources = [(source.meta, source.folder) for source in self._sources(split)]
        settings = {
            "batch_size": self.hparams.batch_size,
            "sampler": sampler,
            "collate_fn": LabelCollate(sources),
            "num_workers": workers,
            "persistent_workers": workers > 0,
        }
        if split != "train":
            return StatefulDataLoader(data, **settings)
        return LabelLoader(data, sampler if sampler is not None else data, **settings)

    def train_dataloader(self) -> LabelLoader:
        loader = self._loader("train", self.hparams.shuffle)
        if self._train_state is not None:
            loader.load_state_dict(self._train_state)
            self._train_state = None
        return loader

    def state_dict(self) -> dict[str, Any]:
        """``{"train_loader": the training loader's state}`` while a fit holds one (else empty).

        Lightning keeps the same state under its fit loop, but loads it only when the training loader is
        first built after the checkpoint was read; a cosine schedule builds it before
        (``estimated_stepping_batches`` in ``configure_optimizers``, Lightning issue 20550), and the position
        would be lost. The DataModule's own state is read before that (for DDP strategies: before the
        strategy's setup) and is loaded into the first training loader built after it.
        """
        loader = self.trainer.train_dataloader if self.trainer is not None else None
        return {"train_loader": loader.state_dict()} if isinstance(loader, LabelLoader) else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._train_state = state_dict.get("train_loader")

    def val_dataloader(self) -> StatefulDataLoader | list:
        # No validation folder: an empty list makes Lightning skip validation.
        return self._loader("val", False) if "val" in self.datasets else []

    def test_dataloader(self) -> StatefulDataLoader:
        return self._loader("test", False)
