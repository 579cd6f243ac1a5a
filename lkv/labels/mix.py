"""Label sources mixed into one data set and cut into equal parts per rank (DDP ranks must step together).

A *source* is one label folder: one ``lkv label`` run over one prompt source (the paper's mix is ChatQA2,
Tulu, the Stack and few-shot sets, each labelled into its own folder). Per epoch, source ``i`` of ``N_i``
rows contributes ``quota_i`` rows: ``N_i`` without weights, ``N · w_i / Σw`` with weights (``N = Σ N_i``,
rounded by largest remainders so the quotas still sum to ``N``). A quota below ``N_i`` takes a different
subset every epoch; above ``N_i`` it repeats rows (whole passes, then a subset).

Every rank yields exactly the same number of rows per epoch, whatever the row counts, so the ranks take
the same number of optimiser steps and meet at the same collectives (gradient all-reduce, validation,
checkpointing). The rows left over are dropped from the epoch:

- map-style (:class:`MixSampler`): the epoch's plan of all quotas is shuffled, cut to a multiple of the
  world size and dealt out round-robin: at most ``world − 1`` rows per epoch, different ones each epoch
  when shuffling;
- streamed (:class:`StreamedLabels`): each source is cut into ``world`` contiguous slices of
  ``⌊N_i / world⌋`` rows (in shard order, counted from the parquet footers), so a rank reads only its own
  slices' shards; at most ``world − 1`` rows per source are never streamed.

A streamed set is resumable mid-epoch through the ``state_dict`` protocol of torchdata's
``StatefulDataLoader`` (:meth:`StreamedLabels.state_dict`): its state is the epoch and the rows handed out,
the same on every rank, and a resumed stream rebuilds its shuffle buffer from the small columns of the rows
before that point instead of reading them whole.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from datasets import Dataset
from torch.utils.data import DistributedSampler, IterableDataset, get_worker_info

from lkv.labels.shards import LabelMeta, load_labels, read_meta, shard_rows
from lkv.model.backbone import ModelSignature, check_compatible

SOURCE_KEY = "_source"  # index of a row's source, added to every row (the collate reads its meta)


@dataclass(frozen=True)
class LabelSource:
    """One label folder: its ``meta.json``, its shards and their row counts (from the parquet footers)."""

    folder: str
    meta: LabelMeta
    files: tuple[str, ...]
    file_rows: tuple[int, ...]

    @classmethod
    def open(cls, folder: str | Path) -> LabelSource:
        counted = shard_rows(folder)
        return cls(
            str(folder), read_meta(folder), tuple(str(p) for p, _ in counted), tuple(n for _, n in counted)
        )

    @property
    def rows(self) -> int:
        return sum(self.file_rows)


def check_same_model(sources: Sequence[LabelSource]) -> None:
    """Refuse sources labelled by different models: their scores describe different attention.

    Raises:
        ValueError: naming both folders, both models and every mismatched field.
    """
    first = ModelSignature.from_dict(sources[0].meta.model)
    for source in sources[1:]:
        check_compatible(
            first,
            ModelSignature.from_dict(source.meta.model),
            f"label folder {source.folder} (mixed with {sources[0].folder}, which was)",
        )


def check_same_setting(sources: Sequence[LabelSource]) -> str:
    """The one prompt setting (``aware`` or ``agnostic``, :attr:`LabelMeta.setting`) of ``sources``' labels.

    A module trains for one setting: its lookahead tokens see the question, or only the context. Folders of
    both would train it for neither, and its exported folder could not say which it serves, so a mix is refused.

    Raises:
        ValueError: naming a folder of each setting.
    """
    by_setting: dict[str, str] = {}
    for source in sources:
        by_setting.setdefault(source.meta.setting, source.folder)
    if len(by_setting) > 1:
        named = ", ".join(f"{folder} is {setting}" for setting, folder in by_setting.items())
        raise ValueError(
            f"label folders of both prompt settings ({named}; meta.json extra.setting): a module trains for "
            "one setting, so fit on aware or on agnostic labels (`lkv label --label_mode`), not both"
        )
    return next(iter(by_setting))


def epoch_quotas(sizes: Sequence[int], weights: Sequence[float] | None) -> list[int]:
    """Rows each source contributes per epoch: ``sizes`` itself without weights, else ``N · w_i / Σw``
    rounded by largest remainders (``N = Σ sizes``), so the epoch keeps its length ``N``.

    Raises:
        ValueError: weights not one per source, negative, or all zero.
    """
    if weights is None:
        return list(sizes)
    if len(weights) != len(sizes):
        raise ValueError(
            f"data.weights: expected one weight per train folder ({len(sizes)}), got {len(weights)}"
        )
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"data.weights: expected non-negative weights with a positive sum, got {list(weights)}"
        )
    total = sum(sizes)
    exact = [total * w / sum(weights) for w in weights]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: quotas[i] - exact[i])
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def draw(size: int, quota: int, epoch: int, generator: torch.Generator | None) -> torch.Tensor:
    """``quota`` row indices of a source of ``size`` rows for one epoch ``(quota,)`` long.

    With a generator: whole random permutations, the last one cut short (a fresh subset each epoch).
    Without: the stored order read cyclically from ``epoch · quota``, so a quota below ``size`` still
    reaches every row over the epochs.
    """
    if generator is None:
        return (epoch * quota + torch.arange(quota)) % size
    passes = max(1, -(-quota // size))  # one pass even for a zero quota (its weight is 0): same random stream
    return torch.cat([torch.randperm(size, generator=generator) for _ in range(passes)])[:quota]


def first_by_id(part: Dataset, limit: int) -> Dataset:
    """The ``limit`` rows of ``part`` with the smallest ids, kept in their stored order.

    The id, not the stored order, decides: ``lkv label --batch_size B`` stores prompts in length order
    (longest first), so the first stored rows would be the longest prompts. Built-in prompt ids carry the
    zero-padded prompt index (``builtin-train-s0-00042-…``), and prompt ``i`` depends only on the seed and
    ``i``, so the first 64 rows by id of a 512-prompt folder are the very prompts a 64-prompt run labels,
    and the subsets nest (first 64 ⊂ first 128 ⊂ …) whatever the shard layout.
    """
    ids = part["id"]
    chosen = sorted(sorted(range(len(ids)), key=ids.__getitem__)[:limit])
    return part.select(chosen)


class MixedLabels(torch.utils.data.Dataset):
    """Map-style sources back to back: index ``i`` of source ``s`` is ``offset_s + i``; rows carry ``_source``.

    Args:
        sources: the label folders.
        limit: keep only each source's first ``limit`` rows by id (:func:`first_by_id`); None keeps all.
    """

    def __init__(self, sources: Sequence[LabelSource], limit: int | None = None) -> None:
        parts = [load_labels(source.folder) for source in sources]
        self.parts: list[Dataset] = parts if limit is None else [first_by_id(p, limit) for p in parts]
        self.offsets = [0]
        for part in self.parts:
            self.offsets.append(self.offsets[-1] + len(part))

    @property
    def sizes(self) -> list[int]:
        return [len(part) for part in self.parts]

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        source = bisect.bisect_right(self.offsets, index) - 1
        return {**self.parts[source][index - self.offsets[source]], SOURCE_KEY: source}


class MixSampler(DistributedSampler):
    """This rank's share of the epoch's mix over a :class:`MixedLabels`: exactly ``⌊Σ quota / world⌋``
    indices on every rank. Lightning calls :meth:`set_epoch`; the plan depends only on ``seed`` and the epoch.

    Args:
        data: the mixed sources.
        quotas: rows per source per epoch (:func:`epoch_quotas`).
        num_replicas, rank: the world size and this process's rank.
        shuffle: shuffle the plan (else sources follow each other in stored order).
        seed: the plan's seed; every rank must use the same.
    """

    def __init__(
        self,
        data: MixedLabels,
        quotas: Sequence[int],
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
    ) -> None:
        super().__init__(
            data, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
        )
        self.sizes = data.sizes
        self.offsets = data.offsets
        self.quotas = list(quotas)
        self.num_samples = sum(self.quotas) // num_replicas
        self.total_size = self.num_samples * num_replicas

    def plan(self) -> torch.Tensor:
        """Every rank's indices for the current epoch, ``(total_size,)``; rank ``r`` takes ``[r::world]``."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch) if self.shuffle else None
        parts = [
            offset + draw(size, quota, self.epoch, generator)
            for offset, size, quota in zip(self.offsets, self.sizes, self.quotas, strict=False)
        ]
        plan = torch.cat(parts)
        if generator is not None:
            plan = plan[torch.randperm(len(plan), generator=generator)]
        return plan[: self.total_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.plan()[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples


Piece = tuple[int, int, int, int]  # (source, file, first row, end row) within one shard


class StreamedLabels(IterableDataset):
    """Streams this rank's rows of the sources from their shards; exactly ``len(self)`` rows per epoch.

    Source ``i``'s slice for rank ``r`` is rows ``[r·k_i, (r+1)·k_i)`` in shard order, ``k_i = ⌊N_i/world⌋``;
    the epoch reads ``⌊quota_i / world⌋`` of them cyclically from ``epoch · that`` (all of them, once,
    without weights). With ``shuffle``, the shards' order is permuted per epoch and rows pass through a
    buffer of at most ``buffer`` rows and ``buffer_bytes`` bytes (per DataLoader worker: with stored scores a
    16K-token row of a 32-layer, 8-KV-head model is 16 MiB, so 2000 such rows would be 32 GiB). DataLoader
    workers split the rows in equal counts, so ranks with the same
    settings also yield the same number of batches. Reading is sequential per shard (one row group at a
    time), never the whole set.

    Resuming (:meth:`state_dict`, :meth:`load_state_dict`, called by torchdata's ``StatefulDataLoader`` per
    worker): the state is ``{"epoch", "yielded"}``, the epoch being read and the rows this worker has handed
    out of it. Both are equal on every rank (equal row counts), so rank 0's state, the one a checkpoint
    keeps, resumes every rank. The next iteration continues that epoch at that row, exactly as an
    uninterrupted iteration would: without shuffling it starts reading there; with shuffling it replays
    the buffer's draws over the rows' ids and sizes (the ``prompt_len`` and ``response_ids`` columns only),
    then reads whole just the row groups of the rows the buffer holds at that point.

    Args:
        sources: the label folders.
        quotas: rows per source per epoch (:func:`epoch_quotas`).
        rank, world: this process's rank and the world size.
        shuffle, seed, buffer, buffer_bytes: shuffling; every rank uses the same seed.
    """

    def __init__(
        self,
        sources: Sequence[LabelSource],
        quotas: Sequence[int],
        rank: int,
        world: int,
        shuffle: bool,
        seed: int,
        buffer: int,
        buffer_bytes: int = 2**30,
    ) -> None:
        for source in sources:
            if source.rows < world:
                raise ValueError(
                    f"label folder {source.folder}: {source.rows} rows cannot be split over {world} ranks "
                    "(each rank needs at least one)"
                )
        self.sources = list(sources)
        self.slices = [source.rows // world for source in sources]
        self.per_rank = [quota // world for quota in quotas]
        self.rank, self.world = rank, world
        self.shuffle, self.seed, self.buffer, self.buffer_bytes = shuffle, seed, buffer, buffer_bytes
        # shared memory: DataLoader workers that persist across epochs see `set_epoch` of the main process
        self._epoch = torch.zeros((), dtype=torch.long).share_memory_()
        self._position: dict[str, int] | None = None  # of the current iteration (in this worker)
        self._resume: dict[str, int] | None = None  # a loaded state, for the next iteration

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (unless a loaded state names another)."""
        return int(self._epoch)

    def __len__(self) -> int:
        return sum(self.per_rank)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "yielded"}`` of the current iteration in this worker (before the first: the epoch set
        and 0)."""
        return dict(self._position or {"epoch": int(self._epoch), "yielded": 0})

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next iteration continue epoch ``state["epoch"]`` after its first ``state["yielded"]``
        rows.

        Raises:
            ValueError: a state without those two non-negative integers.
        """
        if not all(isinstance(state.get(key), int) and state[key] >= 0 for key in ("epoch", "yielded")):
            raise ValueError(
                f"streamed label state: expected non-negative 'epoch' and 'yielded', got {state}"
            )
        self._resume = {"epoch": state["epoch"], "yielded": state["yielded"]}

    def plan(self, epoch: int) -> list[Piece]:
        """This rank's pieces for ``epoch`` in reading order (shard order, or shuffled)."""
        pieces: list[Piece] = []
        for index, (source, size, count) in enumerate(
            zip(self.sources, self.slices, self.per_rank, strict=True)
        ):
            base, start = self.rank * size, (epoch * count) % size if count else 0
            # the cyclic window [start, start + count) over the slice, as runs of consecutive rows
            runs, left, position = [], count, start
            while left:
                run = min(left, size - position)
                runs.append((base + position, base + position + run))
                left, position = left - run, 0
            pieces += [(index, *cut) for first, end in runs for cut in _cut_at_files(source, first, end)]
        if self.shuffle:
            order = torch.randperm(len(pieces), generator=torch.Generator().manual_seed(self.seed + epoch))
            pieces = [pieces[i] for i in order]
        return pieces

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # the epoch and the position are fixed here, not at the first row: DataLoader workers report the state
        # of an iteration as soon as it is created
        resume, self._resume = self._resume, None
        epoch, skip = (resume["epoch"], resume["yielded"]) if resume else (int(self._epoch), 0)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pieces = _share(self.plan(epoch), len(self), worker, workers)
        self._position = {"epoch": epoch, "yielded": skip}
        if self.shuffle:
            buffer = ShuffleBuffer(
                self.buffer, self.buffer_bytes, random.Random(f"{self.seed}/{epoch}/{worker}")
            )
            rows = self._shuffled(pieces, skip, buffer)
        else:
            rows = self._read(_window(pieces, skip, _count(pieces)))
        return self._counted(rows)

    def _counted(self, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for row in rows:
            self._position["yielded"] += 1
            yield row

    def _read(self, pieces: list[Piece]) -> Iterator[dict[str, Any]]:
        return (
            {**row, SOURCE_KEY: source}
            for source, file, first, end in pieces
            for row in read_rows(self.sources[source].files[file], first, end)
        )

    def _shuffled(self, pieces: list[Piece], skip: int, buffer: ShuffleBuffer) -> Iterator[dict[str, Any]]:
        """The rows of ``pieces`` through ``buffer``, from output ``skip`` on."""
        consumed, pending = 0, []
        if skip:
            consumed, pending = buffer.replay(self._sizes(pieces), skip)
            rows = self._rows_at([address for address, _ in buffer.items] + pending)
            buffer.items = [(rows[address], size) for address, size in buffer.items]
            pending = [rows[address] for address in pending]
        yield from pending
        yield from _buffered(self._read(_window(pieces, consumed, _count(pieces))), buffer)

    def _sizes(self, pieces: list[Piece]) -> Iterator[tuple[Address, int]]:
        """``(address, row_bytes)`` of every row of ``pieces`` in order, from their small columns only."""
        for source, file, first, end in pieces:
            meta = self.sources[source].meta
            per_token = np.dtype("int32").itemsize  # prompt_ids
            if meta.store_scores:
                per_token += meta.num_layers * meta.num_kv_heads * np.dtype(meta.score_dtype).itemsize
            path = self.sources[source].files[file]
            for offset, row in enumerate(read_rows(path, first, end, columns=["prompt_len", "response_ids"])):
                size = per_token * row["prompt_len"] + row["response_ids"].nbytes
                yield (source, file, first + offset), size

    def _rows_at(self, addresses: list[Address]) -> dict[Address, dict[str, Any]]:
        """The rows at ``addresses``, reading each row group that holds any of them once."""
        by_file: dict[tuple[int, int], list[int]] = {}
        for source, file, row in addresses:
            by_file.setdefault((source, file), []).append(row)
        return {
            (source, file, row): {**values, SOURCE_KEY: source}
            for (source, file), rows in by_file.items()
            for row, values in read_rows_at(self.sources[source].files[file], rows).items()
        }


Address = tuple[int, int, int]  # (source, file, row within the file) of one streamed row


def _cut_at_files(source: LabelSource, first: int, end: int) -> Iterator[tuple[int, int, int]]:
    """Global rows ``[first, end)`` of a source as ``(file, first, end)`` pieces, rows counted per file."""
    start_of_file = 0
    for file, rows in enumerate(source.file_rows):
        lo, hi = max(first, start_of_file), min(end, start_of_file + rows)
        if lo < hi:
            yield file, lo - start_of_file, hi - start_of_file
        start_of_file += rows


def _share(pieces: list[Piece], total: int, worker: int, workers: int) -> list[Piece]:
    """Worker ``worker``'s rows: the ``worker``-th of ``workers`` contiguous, equal-count parts of ``pieces``."""
    return _window(pieces, worker * total // workers, (worker + 1) * total // workers)


def _window(pieces: list[Piece], lo: int, hi: int) -> list[Piece]:
    """Rows ``[lo, hi)`` of the row sequence that ``pieces`` spell out, as pieces."""
    out, position = [], 0
    for source, file, first, end in pieces:
        a, b = max(lo, position), min(hi, position + end - first)
        if a < b:
            out.append((source, file, first + a - position, first + b - position))
        position += end - first
    return out


def _count(pieces: list[Piece]) -> int:
    return sum(end - first for _, _, first, end in pieces)


class ShuffleBuffer:
    """A streamed shuffle through a buffer of at most ``size`` items and ``max_bytes`` bytes.

    The buffer fills up to either limit (at least one item), then each new item is swapped for a random one
    it holds; when larger items push it over ``max_bytes``, random items leave it until it is within. At the
    end of the stream the rest leave in random order. Memory: at most ``max_bytes`` plus the item being
    swapped in. The draws depend only on the items' sizes, so :meth:`replay` can run them over stand-ins
    (row addresses) and the buffer then continues with the real rows in their place.

    Attributes:
        items: ``(item, bytes)`` held, in buffer order.
    """

    def __init__(self, size: int, max_bytes: int, rng: random.Random) -> None:
        self.size, self.max_bytes, self.rng = size, max_bytes, rng
        self.items: list[tuple[Any, int]] = []
        self.held = 0

    def push(self, item: Any, nbytes: int) -> list[Any]:
        """Take ``item`` of ``nbytes`` bytes in; returns the items that leave, in order."""
        self.held += nbytes
        if not self.items or (len(self.items) < self.size and self.held <= self.max_bytes):
            self.items.append((item, nbytes))
            return []
        index = self.rng.randrange(len(self.items))
        (first, first_bytes), self.items[index] = self.items[index], (item, nbytes)
        self.held -= first_bytes
        out = [first]
        while self.held > self.max_bytes and len(self.items) > 1:
            leaving, leaving_bytes = self.items.pop(self.rng.randrange(len(self.items)))
            self.held -= leaving_bytes
            out.append(leaving)
        return out

    def drain(self) -> list[Any]:
        """Everything held, in random order; the buffer is then empty."""
        self.rng.shuffle(self.items)
        out, self.items, self.held = [item for item, _ in self.items], [], 0
        return out

    def replay(self, sized: Iterable[tuple[Any, int]], skip: int) -> tuple[int, list[Any]]:
        """Run the stream ``sized`` of ``(item, bytes)`` until ``skip`` items have left.

        Returns:
            How many items of ``sized`` were taken in, and the items that left beyond the first ``skip`` (at
            most one push's worth); the buffer then holds what it held at that point of the stream.
        """
        consumed = left = 0
        for item, nbytes in sized:
            consumed += 1
            out = self.push(item, nbytes)
            if left + len(out) >= skip:
                return consumed, out[skip - left :]
            left += len(out)
        return consumed, self.drain()[skip - left :]


def _buffered(rows: Iterable[dict], buffer: ShuffleBuffer) -> Iterator[dict]:
    """``rows`` shuffled through ``buffer`` (each row weighed by :func:`row_bytes`)."""
    for row in rows:
        yield from buffer.push(row, row_bytes(row))
    yield from buffer.drain()


def row_bytes(row: dict[str, Any]) -> int:
    """Bytes of a streamed row's arrays (token ids, scores): what a shuffle buffer holds per row."""
    return sum(value.nbytes for value in row.values() if isinstance(value, np.ndarray))


def read_rows(path: str, first: int, end: int, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Rows ``[first, end)`` of one shard, reading only the row groups that hold them (and only ``columns``,
    when given).

    List columns come back as numpy arrays (scores of 16K-token prompts are millions of values).
    """
    shard = pq.ParquetFile(path)
    group_start = 0
    for group in range(shard.num_row_groups):
        rows = shard.metadata.row_group(group).num_rows
        lo, hi = max(first, group_start), min(end, group_start + rows)
        if lo < hi:
            yield from _table_rows(
                shard.read_row_group(group, columns=columns).slice(lo - group_start, hi - lo)
            )
        group_start += rows


def read_rows_at(path: str, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Rows ``rows`` (indices within one shard) by index, reading each row group that holds any of them
    once."""
    shard = pq.ParquetFile(path)
    wanted, out, group_start = sorted(set(rows)), {}, 0
    for group in range(shard.num_row_groups):
        end = group_start + shard.metadata.row_group(group).num_rows
        here = [row for row in wanted if group_start <= row < end]
        if here:
            table = shard.read_row_group(group).take([row - group_start for row in here])
            out.update(zip(here, _table_rows(table), strict=True))
        group_start = end
    return out


def _table_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    values = {name: table.column(name).combine_chunks() for name in table.column_names}
    for i in range(table.num_rows):
        yield {name: _value(column, i) for name, column in values.items()}


def _value(column: pa.Array, i: int) -> Any:
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return column[i].values.to_numpy(zero_copy_only=False, writable=True)
    return column[i].as_py()
