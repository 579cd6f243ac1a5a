"""What a prompt is, where the embedded documents come from, and how a prompt becomes token ids.

The sources are :class:`lkv.labels.builtin_prompts.BuiltinPrompts` (essay and code prompts from the embedded
corpora) and :mod:`lkv.labels.dataset_prompts` (JSONL files and HF datasets). Every source yields :class:`Prompt` objects and can :meth:`~PromptSource.describe` itself for label-shard
metadata. Documents are split into train and held-out sets by :func:`split_by_document`, a hash of the
document id, so a document used for training prompts never appears in an evaluation task and adding
documents never moves the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from lkv.core.chat import render_chat
from lkv.model import assets

ESSAY_SOURCE = "paul-graham-essays"
STDLIB_SOURCE = "python-stdlib"
DEFAULT_HELDOUT_FRACTION = 0.2
TRUNCATIONS = ("middle", "left", "skip", "error")
Truncation = Literal["middle", "left", "skip", "error"]

# Standard-library folders that are tests, vendored packages or generated tables, not representative code.
_STDLIB_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "encodings",
    "pydoc_data",  # the language reference's prose: the evaluation-only haystack of lkv.eval.tasks.text
}
# Generated data files (_pydecimal, unicode tables) are the only sources above this; 200 kB ≈ 5K lines.
_MAX_SOURCE_BYTES = 200_000


@dataclass
class Prompt:
    """One chat prompt to label or evaluate.

    Args:
        id: stable and unique within its source (label runs resume by id).
        messages: chat turns ``[{"role": ..., "content": ...}]``, ending with a user turn.
        source: where it came from (e.g. ``paul-graham-essays``, ``jsonl:train.jsonl``).
        doc_id: the document it was drawn from; the unit of the train/held-out split.
        kind: instruction family (``summarize``, ``question``, ``extract``, ``code``, ``find_value``, ``chat``).
        answer: the expected answer when one is checkable (``find_value``), else None.
        meta: free-form details (passage length, needle depth, ...).
    """

    id: str
    messages: list[dict[str, str]]
    source: str
    doc_id: str
    kind: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class PromptSource(ABC):
    """An iterable of :class:`Prompt` that can describe itself (recorded in label-shard metadata)."""

    @abstractmethod
    def __iter__(self) -> Iterator[Prompt]: ...

    #: The ``describe()`` setting that counts the prompts when the source yields its first N of a fixed
    #: order (``num_prompts``, ``limit``): a larger value yields the same prompts, then more. None: no such
    #: setting, a label folder holds exactly one source's prompts.
    count_setting: ClassVar[str | None] = None

    @abstractmethod
    def describe(self) -> str:
        """One line naming the source and every setting that changes its prompts."""

    def extends(self, previous: str) -> bool:
        """Whether ``previous``, the ``describe()`` of the source of an earlier labelling run, yields the first
        prompts of this source, so its label folder can grow into this source's (``lkv label`` with a larger
        ``num_prompts``). True for the same source; otherwise only when the two differ in ``count_setting``
        alone and this one counts at least as many (None: no limit)."""
        mine = self.describe()
        if previous == mine or self.count_setting is None:
            return previous == mine
        pattern = rf"\b{re.escape(self.count_setting)}=(\d+|None)\b"
        now, before = re.search(pattern, mine), re.search(pattern, previous)
        if now is None or before is None or before[1] == "None":
            return False
        if now[1] != "None" and int(now[1]) < int(before[1]):
            return False
        return re.sub(pattern, f"{self.count_setting}={now[1]}", previous, count=1) == mine


def check_passage_counts(num_prompts: int, min_words: int, max_words: int) -> None:
    """Check a generated prompt source's count and passage length range.

    Raises:
        ValueError: ``num_prompts < 0``, or not ``1 ≤ min_words ≤ max_words``.
    """
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be ≥ 0, got {num_prompts}")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 ≤ min_words ≤ max_words, got min_words={min_words}, max_words={max_words}")


def prompt_id(name: str, index: int, content: object) -> str:
    """``<name>-<index:05d>-<digest>``: a generated prompt's id, ``digest`` the first 8 hex digits of the
    SHA-256 of ``content`` as JSON (its messages, and whatever else it asks). The digest keeps ids distinct
    across settings that ``name`` does not spell out: label runs resume by skipping known ids."""
    digest = hashlib.sha256(json.dumps(content).encode()).hexdigest()[:8]
    return f"{name}-{index:05d}-{digest}"


def split_by_document(
    doc_ids: Sequence[str], heldout_fraction: float, salt: str = "lkv"
) -> tuple[set[str], set[str]]:
    """Split document ids into ``(train, heldout)`` by a hash of ``salt`` and the id.

    A document's side depends on nothing but its own id, the salt and the fraction: adding or removing
    documents never moves another one across the split.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction}")
    train: set[str] = set()
    heldout: set[str] = set()
    for doc_id in doc_ids:
        (heldout if document_share(doc_id, salt) < heldout_fraction else train).add(doc_id)
    return train, heldout


def document_share(doc_id: str, salt: str = "lkv") -> float:
    """A number in ``[0, 1)`` fixed by a hash of ``salt`` and ``doc_id``: a document is held out when it is
    below the held-out fraction (:func:`split_by_document`; :func:`lkv.labels.sources.document_split`)."""
    digest = hashlib.sha256(f"{salt}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def essay_documents(root: str | Path | None = None) -> dict[str, Path]:
    """Doc id (``paul-graham-essays/<name>``) → file, for every essay in ``root`` (default: the cache)."""
    folder = Path(root) if root is not None else assets.essays_dir()
    return {f"{ESSAY_SOURCE}/{path.stem}": path for path in sorted(folder.glob("*.txt"))}


def stdlib_documents(root: str | Path | None = None) -> dict[str, Path]:
    """Doc id (``python-stdlib/<relative path>``) → file, for the standard library's own modules.

    Skips test suites, vendored packages, generated tables and files over 200 kB.
    """
    folder = Path(root) if root is not None else assets.stdlib_dir()
    docs: dict[str, Path] = {}
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP_DIRS)
        for name in sorted(files):
            path = Path(current) / name
            code = name.endswith(".py") and not name.startswith("_sysconfigdata")
            if code and path.stat().st_size <= _MAX_SOURCE_BYTES:
                docs[f"{STDLIB_SOURCE}/{path.relative_to(folder).as_posix()}"] = path
    return docs


# ---------------------------------------------------------------------------------------------------------
# Rendering


def render_prompt(
    prompt: Prompt,
    tokenizer,
    max_prompt_tokens: int,
    truncation: Truncation = "middle",
    enable_thinking: bool = False,
) -> list[int] | None:
    """Token ids of ``prompt`` under the tokenizer's chat template, ready for generation.

    The template is applied with ``add_generation_prompt=True`` and the text tokenised without extra
    special tokens (the template writes its own).

    Args:
        max_prompt_tokens: length limit of the rendered prompt.
        enable_thinking: the chat template's variable (:func:`lkv.core.chat.template_kwargs`); off, Qwen3's
            template closes an empty ``<think>`` block, so the response is the answer itself. A template
            that does not read it ignores it.
        truncation: for an over-long prompt — ``middle`` keeps the first and last halves of the longest user
            turn's tokens (LongBench style), ``left`` keeps its end; both cut inside the content and render
            again, so the template stays intact. ``skip`` returns None; ``error`` raises.

    Raises:
        ValueError: empty prompt; ``truncation="error"`` and the prompt is too long; or the template and
            the other turns alone exceed the limit.
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    if max_prompt_tokens <= 0:
        raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
    if not any(m["content"].strip() for m in prompt.messages):
        raise ValueError(f"prompt {prompt.id!r} is empty")
    ids = _encode(tokenizer, prompt.messages, enable_thinking)
    if len(ids) <= max_prompt_tokens:
        return ids
    if truncation == "skip":
        return None
    if truncation == "error":
        raise ValueError(
            f"prompt {prompt.id!r} is {len(ids)} tokens, over max_prompt_tokens={max_prompt_tokens} "
            "(truncation='error'; use 'middle', 'left' or 'skip' to accept it)"
        )
    users = [i for i, m in enumerate(prompt.messages) if m["role"] == "user"]
    target = max(users, key=lambda i: len(prompt.messages[i]["content"]))
    content = tokenizer(prompt.messages[target]["content"], add_special_tokens=False)["input_ids"]
    overflow = len(ids) - max_prompt_tokens
    while True:
        keep = len(content) - overflow
        if keep <= 0:
            raise ValueError(
                f"prompt {prompt.id!r} does not fit max_prompt_tokens={max_prompt_tokens} even with its longest "
                f"user turn removed ({len(ids) - len(content)} tokens of template and other turns)"
            )
        if truncation == "middle":
            head = keep // 2
            text = _decode(tokenizer, content[:head]) + _decode(
                tokenizer, content[len(content) - (keep - head) :]
            )
        else:
            text = _decode(tokenizer, content[len(content) - keep :])
        messages = [dict(m) for m in prompt.messages]
        messages[target]["content"] = text
        ids = _encode(tokenizer, messages, enable_thinking)
        if len(ids) <= max_prompt_tokens:
            return ids
        # Cutting and decoding can merge tokens differently; shrink by what is still over.
        overflow += len(ids) - max_prompt_tokens


def _encode(tokenizer, messages: list[dict[str, str]], enable_thinking: bool) -> list[int]:
    text = render_chat(tokenizer, messages, enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
