"""Prompts from your own data: JSONL files and Hugging Face datasets (local or streamed)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lkv.core.files import not_utf8
from lkv.labels.prompts import Prompt, PromptSource


class JsonlPrompts(PromptSource):
    """Prompts from a JSONL file: one JSON object per line with a ``messages`` list or a ``prompt`` string.

    Optional per-line keys: ``doc_id`` (default: the prompt id), ``kind`` (default ``chat``), ``answer``,
    ``evidence`` (the prompt's sentence that states the answer: what ``lkv label --gold_answers`` teacher-forces).
    Trailing assistant turns are dropped: the model's own response is what gets labelled.

    Args:
        path: the ``.jsonl`` file.
        field: key holding the prompt; default: ``messages`` if present, else ``prompt``.
        id_field: key holding a unique id; default: ``<file stem>-<line number>``.
    """

    def __init__(self, path: str, field: str | None = None, id_field: str | None = None) -> None:
        self.path = Path(path)
        self.field = field
        self.id_field = id_field

    def __iter__(self) -> Iterator[Prompt]:
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such prompt file")
        try:
            yield from self._records()
        except UnicodeDecodeError as error:
            raise not_utf8(self.path, error, "prompt file") from None

    def _records(self) -> Iterator[Prompt]:
        seen: dict[str, int] = {}
        with self.path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                where = f"{self.path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"{where}: not valid JSON ({error.msg} at column {error.colno})"
                    ) from None
                prompt = _record_prompt(
                    record,
                    where,
                    f"jsonl:{self.path.name}",
                    f"{self.path.stem}-{number}",
                    self.field,
                    self.id_field,
                )
                if prompt.id in seen:
                    raise ValueError(f"{where}: id {prompt.id!r} already used on line {seen[prompt.id]}")
                seen[prompt.id] = number
                yield prompt

    def describe(self) -> str:
        return f"JsonlPrompts(path={self.path}, field={self.field}, id_field={self.id_field})"


class HFDatasetPrompts(PromptSource):
    """Prompts from a Hugging Face dataset: a hub id (when online) or a local file or folder.

    Rows hold a ``messages`` list or a ``prompt`` string like :class:`JsonlPrompts` lines. Local
    ``.json``/``.jsonl``/``.parquet``/``.arrow``/``.csv`` files and folders of them load offline.

    Args:
        path_or_name: hub id (e.g. ``nvidia/ChatQA2-Long-SFT-data``), local folder or data file.
        split: dataset split.
        field: column holding the prompt; default: ``messages`` if present, else ``prompt``.
        streaming: stream rows instead of downloading/materialising the whole split.
        config_name: dataset configuration (e.g. ``long_sft``).
        id_field: column with a unique id; default: ``<name>-<split>-<row>``.
        context_field: column with a document to put before the first user turn (ChatQA-style
            ``document``); it also becomes the ``doc_id`` (hashed) unless ``doc_field`` is given.
        doc_field: column naming the source document, for :func:`split_by_document`.
        limit: stop after this many prompts.
    """

    count_setting = "limit"

    def __init__(
        self,
        path_or_name: str,
        split: str = "train",
        field: str | None = None,
        streaming: bool = False,
        config_name: str | None = None,
        id_field: str | None = None,
        context_field: str | None = None,
        doc_field: str | None = None,
        limit: int | None = None,
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be ≥ 0 or None, got {limit}")
        self.path_or_name = path_or_name
        self.split = split
        self.field = field
        self.streaming = streaming
        self.config_name = config_name
        self.id_field = id_field
        self.context_field = context_field
        self.doc_field = doc_field
        self.limit = limit

    def _dataset(self):
        from datasets import load_dataset  # imported on use: configs must parse without loading datasets

        path = Path(self.path_or_name)
        if path.is_file():
            builders = {
                ".json": "json",
                ".jsonl": "json",
                ".parquet": "parquet",
                ".arrow": "arrow",
                ".csv": "csv",
            }
            if path.suffix not in builders:
                raise ValueError(
                    f"{path}: unsupported data file type {path.suffix!r}, expected one of {list(builders)}"
                )
            return load_dataset(
                builders[path.suffix], data_files=str(path), split=self.split, streaming=self.streaming
            )
        return load_dataset(self.path_or_name, self.config_name, split=self.split, streaming=self.streaming)

    def __iter__(self) -> Iterator[Prompt]:
        name = Path(self.path_or_name).name if Path(self.path_or_name).exists() else self.path_or_name
        source = f"hf:{self.path_or_name}" + (f"/{self.config_name}" if self.config_name else "")
        for row, record in enumerate(self._dataset()):
            if self.limit is not None and row >= self.limit:
                return
            where = f"{self.path_or_name} [{self.split}] row {row}"
            prompt = _record_prompt(
                record, where, source, f"{name}-{self.split}-{row}", self.field, self.id_field
            )
            if self.context_field is not None:
                context = _required(record, self.context_field, str, where)
                first_user = next(m for m in prompt.messages if m["role"] == "user")
                first_user["content"] = f"{context}\n\n{first_user['content']}"
                prompt.doc_id = "context-" + hashlib.sha256(context.encode()).hexdigest()[:16]
            if self.doc_field is not None:
                prompt.doc_id = str(_required(record, self.doc_field, (str, int), where))
            yield prompt

    def describe(self) -> str:
        return (
            f"HFDatasetPrompts(path_or_name={self.path_or_name}, config_name={self.config_name}, "
            f"split={self.split}, field={self.field}, context_field={self.context_field}, limit={self.limit})"
        )


def _required(record: dict, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in record:
        raise ValueError(f"{where}: missing field {key!r} (found {sorted(record)})")
    value = record[key]
    if not isinstance(value, types):
        raise ValueError(f"{where}: field {key!r} must be {_type_names(types)}, found {type(value).__name__}")
    return value


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


def _record_prompt(
    record: Any, where: str, source: str, default_id: str, field_name: str | None, id_field: str | None
) -> Prompt:
    """A :class:`Prompt` from one JSON object / dataset row."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, found {type(record).__name__}")
    if field_name is None:
        field_name = next((k for k in ("messages", "prompt") if k in record), None)
        if field_name is None:
            raise ValueError(
                f"{where}: expected a 'messages' list or a 'prompt' string, found keys {sorted(record)}"
            )
    prompt_id = str(_required(record, id_field, (str, int), where)) if id_field else default_id
    answer, evidence = record.get("answer"), record.get("evidence")
    return Prompt(
        id=prompt_id,
        messages=_messages(_required(record, field_name, (str, list), where), where, field_name),
        source=source,
        doc_id=str(record.get("doc_id", prompt_id)),
        kind=str(record.get("kind", "chat")),
        answer=answer if isinstance(answer, str) else None,
        meta={"evidence": evidence} if isinstance(evidence, str) else {},
    )


def _messages(value: str | list, where: str, field_name: str) -> list[dict[str, str]]:
    """Validate chat turns (a bare string is one user turn); trailing assistant turns are dropped."""
    if isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    else:
        messages = []
        for i, turn in enumerate(value):
            valid = (
                isinstance(turn, dict)
                and isinstance(turn.get("role"), str)
                and isinstance(turn.get("content"), str)
            )
            if not valid:
                raise ValueError(
                    f"{where}: {field_name}[{i}] must be {{'role': str, 'content': str}}, found {turn!r:.80}"
                )
            if turn["role"] not in ("system", "user", "assistant"):
                raise ValueError(
                    f"{where}: {field_name}[{i}] has role {turn['role']!r}, expected system, user or assistant"
                )
            messages.append({"role": turn["role"], "content": turn["content"]})
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise ValueError(f"{where}: {field_name} has no non-empty user turn")
    return messages
