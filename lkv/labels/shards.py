"""Label shards: parquet files of prompts, responses and ground-truth importance, plus one ``meta.json``.

Layout of a label folder::

    meta.json                       what made the labels (model signature, R, limits, dtype, source)
    labels-r000-00000.parquet       rank 0's first shard, ...

A shard is written to a temporary name and renamed into place, so a reader never sees a partial file and
an interrupted run loses at most the samples it had not flushed. Scores are stored flattened; a row's
``(layers, kv_heads, prompt_len)`` shape comes from ``meta.json`` and its ``prompt_len`` column.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from datasets import Dataset, Features, List, Value, load_dataset

SCHEMA_VERSION = 1
META_FILE = "meta.json"
SHARD_GLOB = "labels-r*-*.parquet"
_SHARD_RE = re.compile(r"labels-r(\d{3})-(\d{5})\.parquet$")
SCORE_DTYPES = ("float16", "float32")
#: ``extra`` key of the setting labels train a module for: ``aware`` (the question is in the labelled prompt)
#: or ``agnostic`` (the prompt is the context alone; `lkv label --label_mode`)
SETTING_KEY = "setting"
#: ``extra`` key of agnostic labels: how a context's questions' importances were reduced (``max``, ``mean``)
REDUCTION_KEY = "question_reduction"


@dataclass
class LabelMeta:
    """What produced a label folder; a rerun or a reader must agree with it."""

    model: dict[str, Any]
    response_tokens: int
    max_prompt_tokens: int
    truncation: str
    score_dtype: str
    store_scores: bool
    prompt_source: str
    lkv_version: str
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def setting(self) -> str:
        """``aware`` or ``agnostic``: the prompt setting these labels train a module for."""
        return canonical_extra(self.extra)[SETTING_KEY]

    @property
    def num_layers(self) -> int:
        return int(self.model["num_layers"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.model["num_kv_heads"])


def canonical_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` as this lkv writes it: folders from before the setting was recorded are ``aware``, those from
    when it was called ``label_mode`` have it under :data:`SETTING_KEY`, and agnostic ones from before
    several questions had their one question reduced by ``max`` (the identity)."""
    out = dict(extra)
    old = out.pop("label_mode", "aware")
    out.setdefault(SETTING_KEY, old)
    if out[SETTING_KEY] == "agnostic":
        out.setdefault(REDUCTION_KEY, "max")
    return out


def features(score_dtype: str) -> Features:
    """Arrow schema of one label row."""
    if score_dtype not in SCORE_DTYPES:
        raise ValueError(f"score_dtype must be one of {SCORE_DTYPES}, got {score_dtype!r}")
    return Features(
        {
            "id": Value("string"),
            "source": Value("string"),
            "kind": Value("string"),
            "doc_id": Value("string"),
            "prompt_len": Value("int32"),
            "prompt_ids": List(Value("int32")),
            "response_ids": List(Value("int32")),
            "scores": List(Value(score_dtype)),
        }
    )


def read_meta(folder: str | Path) -> LabelMeta:
    """Load ``meta.json`` of a label folder, with a clear error when it is missing or malformed."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no label metadata — is {folder} a folder written by `lkv label`?")
    try:
        raw = json.loads(path.read_text())
        meta = LabelMeta(**raw)
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: malformed label metadata ({err})") from err
    if meta.schema_version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {meta.schema_version}, this lkv reads {SCHEMA_VERSION}")
    return meta


def _write_meta(folder: Path, meta: LabelMeta, rank: int) -> None:
    """Write ``meta.json`` atomically (a temporary file renamed into place: readers never see half of it)."""
    path = folder / META_FILE
    # the rank too: ranks on different nodes of a shared file system can share a pid
    tmp = path.with_name(f".{META_FILE}.r{rank}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(meta), indent=2, sort_keys=True))
    os.replace(tmp, path)


def grow_prompt_source(folder: str | Path, source: str, rank: int = 0) -> None:
    """Record ``source`` as the prompt source of ``folder``, whose labels are the first prompts of it
    (:meth:`lkv.labels.prompts.PromptSource.extends`): a run labelling the rest into the folder follows."""
    meta = read_meta(folder)
    meta.prompt_source = source
    _write_meta(Path(folder), meta, rank)


def shard_files(folder: str | Path) -> list[Path]:
    """Finished shards of a label folder in (rank, index) order; temporary files are never listed."""
    return sorted(p for p in Path(folder).glob(SHARD_GLOB) if _SHARD_RE.search(p.name))


def finished_ids(folder: str | Path) -> set[str]:
    """Ids of every sample already in a finished shard (reads only the ``id`` column)."""
    ids: set[str] = set()
    for path in shard_files(folder):
        try:
            ids.update(pq.read_table(path, columns=["id"]).column("id").to_pylist())
        except Exception as err:  # pyarrow raises several types for damaged files
            raise ValueError(
                f"{path}: unreadable label shard ({err}); delete it and rerun `lkv label`"
            ) from err
    return ids


def check_scores(scores: torch.Tensor, where: str) -> None:
    """Refuse NaN/inf, negative or unnormalised ``(layers, kv_heads, S)`` importance.

    Raises:
        ValueError: ``where``, the field (``scores``), what a score row must be and what was found.
    """
    bad = (~torch.isfinite(scores)).sum().item()
    if bad:
        raise ValueError(f"{where}: field 'scores' must be finite; found {bad} NaN/inf values")
    if (scores < 0).any():
        raise ValueError(
            f"{where}: field 'scores' must be non-negative; found {(scores < 0).sum().item()} negative "
            f"values (min {scores.min().item():.3g})"
        )
    sums = scores.float().sum(-1)
    # fp16 storage of ~1K probabilities sums to 1 within ~1e-3.
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-2):
        raise ValueError(
            f"{where}: field 'scores' rows must sum to 1 over the prompt per (layer, kv_head); found sums in "
            f"[{sums.min().item():.4f}, {sums.max().item():.4f}]"
        )


class ShardWriter:
    """Buffers label rows and writes them as atomic parquet shards.

    Args:
        folder: label folder; created if needed. If it already holds labels, ``meta`` must match them
            (same model, limits and settings), otherwise the folder belongs to another run and is refused.
        meta: description of this run.
        shard_size: rows per shard (an interrupted run redoes at most this many samples).
        rank: process rank; each rank writes its own shard sequence.
    """

    def __init__(self, folder: str | Path, meta: LabelMeta, shard_size: int = 64, rank: int = 0) -> None:
        if shard_size <= 0:
            raise ValueError(f"shard_size must be positive, got {shard_size}")
        self.folder = Path(folder)
        self.meta = meta
        self.shard_size = shard_size
        self.rank = rank
        self.features = features(meta.score_dtype)
        self._rows: list[dict[str, Any]] = []
        self.folder.mkdir(parents=True, exist_ok=True)
        self._claim_folder()
        mine = [p for p in shard_files(self.folder) if int(_SHARD_RE.search(p.name).group(1)) == rank]
        self._next = 1 + max((int(_SHARD_RE.search(p.name).group(2)) for p in mine), default=-1)

    def _claim_folder(self) -> None:
        path = self.folder / META_FILE
        if path.exists():
            existing = read_meta(self.folder)
            ours = asdict(self.meta)
            theirs = asdict(existing)
            # The lkv version may change between a run and its resumption; everything else must not.
            ours.pop("lkv_version")
            theirs.pop("lkv_version")
            ours["extra"], theirs["extra"] = canonical_extra(ours["extra"]), canonical_extra(theirs["extra"])
            if ours != theirs:
                diff = sorted(k for k in ours if ours[k] != theirs.get(k))
                raise ValueError(
                    f"{self.folder} already holds labels from a different run (differs in: {', '.join(diff)}); "
                    "use another output folder or delete it"
                )
            return
        if shard_files(self.folder):
            raise ValueError(f"{self.folder} holds label shards but no {META_FILE}; refusing to mix runs")
        _write_meta(self.folder, self.meta, self.rank)

    def add(
        self,
        *,
        id: str,
        prompt_ids: list[int],
        response_ids: list[int],
        scores: torch.Tensor | None,
        source: str = "",
        kind: str = "",
        doc_id: str = "",
    ) -> None:
        """Queue one sample; ``scores`` is ``(layers, kv_heads, len(prompt_ids))`` or ``None`` when the
        run stores responses only."""
        prompt_len = len(prompt_ids)
        if self.meta.store_scores:
            expected = (self.meta.num_layers, self.meta.num_kv_heads, prompt_len)
            if scores is None or tuple(scores.shape) != expected:
                found = None if scores is None else tuple(scores.shape)
                raise ValueError(f"sample {id}: scores must have shape {expected}, got {found}")
            check_scores(scores, f"sample {id}")
            flat = scores.detach().to("cpu", getattr(torch, self.meta.score_dtype)).flatten().numpy()
        else:
            flat = np.zeros(0, dtype=self.meta.score_dtype)
        self._rows.append(
            {
                "id": id,
                "source": source,
                "kind": kind,
                "doc_id": doc_id,
                "prompt_len": prompt_len,
                "prompt_ids": prompt_ids,
                "response_ids": response_ids,
                "scores": flat,
            }
        )
        if len(self._rows) >= self.shard_size:
            self.flush()

    def flush(self) -> Path | None:
        """Write the buffered rows as one shard (atomic rename); returns its path."""
        if not self._rows:
            return None
        final = self.folder / f"labels-r{self.rank:03d}-{self._next:05d}.parquet"
        tmp = self.folder / f".{final.name}.{os.getpid()}.tmp"
        Dataset.from_list(self._rows, features=self.features).to_parquet(str(tmp))
        os.replace(tmp, final)
        self._rows = []
        self._next += 1
        return final


def shard_rows(folder: str | Path) -> list[tuple[Path, int]]:
    """``(shard, rows)`` of every finished shard, in :func:`shard_files` order, from the parquet footers only.

    Each shard's footer and columns are checked (a few KB per file), so a damaged or foreign file is named
    before any training starts.

    Raises:
        FileNotFoundError: no shards.
        ValueError: a shard that is not a readable label shard, or shards holding no rows at all.
    """
    files = shard_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder}: no label shards ({SHARD_GLOB}); run `lkv label` first")
    schema = features(read_meta(folder).score_dtype)
    counted = [(path, _check_shard(path, schema)) for path in files]
    if sum(rows for _, rows in counted) == 0:
        raise ValueError(f"{folder}: expected labelled samples, found {len(files)} shards holding 0 rows")
    return counted


def load_labels(folder: str | Path) -> Dataset:
    """Open every finished shard of a label folder as one map-style ``datasets`` dataset (memory-mapped
    arrow; streamed reading is :class:`lkv.labels.mix.StreamedLabels`). The shards are checked first
    (:func:`shard_rows`).

    Raises:
        FileNotFoundError: no shards.
        ValueError: a shard that is not a readable label shard, or shards holding no rows at all.
    """
    files = [path for path, _ in shard_rows(folder)]
    schema = features(read_meta(folder).score_dtype)
    try:
        return load_dataset(
            "parquet",
            data_files=[str(p) for p in files],
            split="train",
            features=schema,
        )
    except Exception as err:
        raise ValueError(f"{folder}: could not read label shards ({err})") from err


def _check_shard(path: Path, schema: Features) -> int:
    """Rows of one shard, after checking that its footer reads and its columns are the label columns."""
    try:
        parquet = pq.read_metadata(path)
    except Exception as err:  # pyarrow raises several types for damaged files
        raise ValueError(
            f"{path}: expected a complete parquet label shard, found an unreadable file ({err}); "
            "delete it and rerun `lkv label` to relabel its prompts"
        ) from err
    found = parquet.schema.to_arrow_schema().names
    if sorted(found) != sorted(schema):
        raise ValueError(f"{path}: expected label columns {sorted(schema)}, found {sorted(found)}")
    return parquet.num_rows


def row_scores(row: dict[str, Any], meta: LabelMeta, folder: str | Path | None = None) -> torch.Tensor:
    """Reshape a row's flattened scores to ``(layers, kv_heads, prompt_len)`` float32, validated.

    ``folder`` (the label folder the row came from) is named in errors.
    """
    where = f"{folder}: sample {row['id']}" if folder is not None else f"sample {row['id']}"
    prompt_len = int(row["prompt_len"])
    flat = torch.as_tensor(np.asarray(row["scores"], dtype=np.float32))
    expected = meta.num_layers * meta.num_kv_heads * prompt_len
    if flat.numel() != expected:
        raise ValueError(
            f"{where}: field 'scores' holds {flat.numel()} values, expected layers·kv_heads·prompt_len = "
            f"{meta.num_layers}·{meta.num_kv_heads}·{prompt_len} = {expected}"
        )
    scores = flat.view(meta.num_layers, meta.num_kv_heads, prompt_len)
    check_scores(scores, where)
    return scores
