"""Responses generated elsewhere (vLLM, TGI, ...) for ``lkv label --responses FILE.jsonl``.

A serving engine generates the responses in a separate job at its own speed; ``lkv label`` then computes
only the teacher-forced ground truth. One JSON object per line::

    {"id": "essay-0001", "response": "The essay argues ..."}                     text, tokenised here
    {"id": "essay-0002", "response_ids": [791, 9071, 29633, 128009]}             token ids, used as given
    {"id": "essay-0003", "response_ids": [...], "response": "...", "prompt_ids": [...]}

``id`` names the prompt (as the prompt source spells it). Give ``response`` (text), ``response_ids``
(token ids, e.g. vLLM's ``CompletionOutput.token_ids``; an ending EOS id is labelled like any other token) or
both (they must agree). Optional ``prompt_ids``: the engine's prompt tokens, checked against lkv's rendering
of the prompt, so that a response to another template or truncation is refused.

Checks, each refusing with the file, line and id: every prompt to label has a response; the tokenisation
round-trips (text → ids → text gives the text back, ids → text → ids gives the ids back: otherwise the engine
used another tokenizer, or the text was normalised on the way); ids are in the vocabulary; a response is at
most ``response_tokens`` long.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lkv.core.files import read_text


@dataclass
class EngineResponse:
    """One line of a responses file.

    Attributes:
        id: the prompt's id.
        where: ``file:line``, for error messages.
        text: the response text, if given.
        token_ids: the response tokens, if given.
        prompt_ids: the engine's prompt tokens, if given.
    """

    id: str
    where: str
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None


class ResponsesFile:
    """A responses JSONL file, read and checked for shape once (no tokenizer needed).

    Args:
        path: the ``.jsonl`` file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"--responses {self.path}: no such file")
        self.responses: dict[str, EngineResponse] = {}
        for number, line in enumerate(read_text(self.path, "--responses").split("\n"), start=1):
            if line.strip():
                self._add(line, f"{self.path}:{number}")
        if not self.responses:
            raise ValueError(f"--responses {self.path}: the file holds no responses")
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        # where the responses came from, for the label folder's meta (fixed before keep_only)
        self.source: dict[str, Any] = {
            "file": str(self.path.resolve()),
            "records": len(self.responses),
            "sha256": digest,
        }

    def _add(self, line: str, where: str) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(record, dict) or not isinstance(record.get("id"), (str, int)):
            raise ValueError(
                f"{where}: expected a JSON object with a string 'id', found {line.strip()[:80]!r}"
            )
        key = str(record["id"])
        if key in self.responses:
            raise ValueError(f"{where}: id {key!r} already has a response at {self.responses[key].where}")
        text, ids, prompt = record.get("response"), record.get("response_ids"), record.get("prompt_ids")
        if text is None and ids is None:
            raise ValueError(
                f"{where}: id {key!r} has neither 'response' (text) nor 'response_ids' (token ids)"
            )
        if text is not None and not isinstance(text, str):
            raise ValueError(f"{where}: id {key!r}: 'response' must be a string, found {type(text).__name__}")
        for name, value in (("response_ids", ids), ("prompt_ids", prompt)):
            if value is not None and not (
                isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
            ):
                raise ValueError(f"{where}: id {key!r}: {name!r} must be a list of integers")
        self.responses[key] = EngineResponse(key, where, text, ids, prompt)

    def check_covers(self, prompt_ids: Iterable[str]) -> None:
        """Refuse unless every prompt id in ``prompt_ids`` has a response (names the first missing ones)."""
        missing = [i for i in prompt_ids if i not in self.responses]
        if missing:
            raise ValueError(
                f"--responses {self.path}: no response for {len(missing)} prompt(s), e.g. id {missing[0]!r}"
                + (f" (also {', '.join(map(repr, missing[1:4]))})" if len(missing) > 1 else "")
                + "; every prompt to label needs one"
            )

    def keep_only(self, prompt_ids: Iterable[str]) -> None:
        """Forget the responses of prompts not in ``prompt_ids`` (already labelled, or not selected)."""
        wanted = set(prompt_ids)
        self.responses = {key: value for key, value in self.responses.items() if key in wanted}

    def tokens(self, prompt_id: str, tokenizer, response_tokens: int) -> list[int]:
        """The response of ``prompt_id`` as token ids, after the round-trip checks of the module docstring."""
        response = self.responses[prompt_id]
        where = f"--responses {response.where} (id {prompt_id!r})"
        if response.token_ids is not None:
            ids = response.token_ids
            bad = [i for i in ids if not 0 <= i < len(tokenizer)]
            if bad:
                raise ValueError(
                    f"{where}: token ids {bad[:5]} are outside the vocabulary (size {len(tokenizer)})"
                )
            again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
            if again != ids:
                raise ValueError(
                    f"{where}: 'response_ids' do not round-trip through the tokenizer (ids → text → ids gives "
                    f"{_first_difference(ids, again)}): produced with another tokenizer? Give the text as "
                    "'response' instead to label its canonical tokenisation"
                )
            if response.text is not None and tokenizer.decode(ids, skip_special_tokens=True) != response.text:
                raise ValueError(f"{where}: 'response_ids' decode to other text than 'response'")
        else:
            ids = tokenizer(response.text, add_special_tokens=False)["input_ids"]
            back = tokenizer.decode(ids)
            if back != response.text:
                raise ValueError(
                    f"{where}: the response text does not round-trip through the tokenizer (text → ids → text "
                    f"gives {back[:60]!r}... for {response.text[:60]!r}...): another tokenizer's normalisation?"
                )
        if not ids:
            raise ValueError(f"{where}: the response is empty")
        if len(ids) > response_tokens:
            raise ValueError(
                f"{where}: the response has {len(ids)} tokens, over --response_tokens {response_tokens}"
            )
        return ids

    def check_prompt(self, prompt_id: str, rendered: list[int]) -> None:
        """Refuse a response whose ``prompt_ids`` differ from lkv's rendering of the prompt."""
        response = self.responses[prompt_id]
        if response.prompt_ids is not None and response.prompt_ids != rendered:
            raise ValueError(
                f"--responses {response.where} (id {prompt_id!r}): 'prompt_ids' differ from the prompt as lkv "
                f"renders it ({_first_difference(rendered, response.prompt_ids)}): the engine saw another "
                "template or truncation"
            )


def _first_difference(want: list[int], found: list[int]) -> str:
    """``'token k: a vs b'`` for the first position where two id lists differ (or their lengths)."""
    for k, (a, b) in enumerate(zip(want, found, strict=False)):
        if a != b:
            return f"token {k}: {b} where {a} was expected"
    return f"{len(found)} tokens where {len(want)} were expected"
