"""Decode many compressed prompts of ``lkv eval`` at once: the answers of several (sample, method, budget) rows.

After eviction a prompt's cache is fixed for every method that acts at prefill only (FullKV, the Oracle,
LookaheadKV, SnapKV, PyramidKV, StreamingLLM, H2O, TOVA, Random, LAQ, SpecKV): decoding it is a plain
greedy loop, and rows of equal cache shape can share each forward pass. :class:`AnswerBatches` collects
such answers (:class:`AnswerRequest`) and decodes them ``batch_size`` at a time with
:func:`lkv.core.batched_generation.greedy_batch`:

- caches whose layers all hold the same number of entries stack with left padding and an attention mask
  (a budget ``C`` gives ``C`` entries; a prompt shorter than ``C``, FullKV, or an appended question give
  other counts);
- ragged caches (PyramidKV's per-layer budgets) stack only with caches of exactly the same layer lengths;
- each row's new tokens continue from its *uncompressed* length (prompt + appended question), never from
  its cache length, exactly as :func:`lkv.core.generation.decode` does at batch 1.

A row stops at EOS, at ``max_new_tokens``, at a stop string, or, where the task allows it
(:attr:`lkv.eval.tasks.Task.settles_at_full_score`), as soon as its answer scores 1. Methods whose cache
changes while decoding (decode-time policies) keep the one-at-a-time path of the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.batched_generation import greedy_batch, stack_caches, stack_layout
from lkv.core.clock import clock
from lkv.core.generation import Sampling, StopStrings, answer_text, append_tokens
from lkv.eviction.records import CompressedPrompt, Generation, answer_record

Settled = Callable[[str], bool]


@dataclass
class AnswerRequest:
    """One answer to decode from a compressed prompt.

    Attributes:
        compressed: the evicted prompt; its cache (``(1, kv_heads, C_l, head_dim)`` per layer, a copy this
            request owns) already holds the appended question in the question-agnostic setting.
        next_logits: ``(1, vocab)`` logits for the first answer token.
        position: position id of the first answer token (uncompressed prompt + appended question).
        question_s: seconds spent appending the question (0 when question-aware).
        sampling: answer length and stop strings (greedy only).
        settled: called with the answer text after each token; ``True`` means no further token can change the
            task's score, so the answer ends there (``None``: decode to ``max_new_tokens``).
    """

    compressed: CompressedPrompt
    next_logits: torch.Tensor
    position: int
    question_s: float
    sampling: Sampling
    settled: Settled | None = None


@torch.no_grad()
def answer_request(
    model: PreTrainedModel,
    compressed: CompressedPrompt,
    appended: list[int],
    sampling: Sampling,
    settled: Settled | None = None,
) -> AnswerRequest:
    """The request for an answer to ``compressed`` (its cache is taken over and grows by ``appended``).

    Args:
        appended: question tokens to append after compression (question-agnostic setting), or ``[]``.
    """
    if sampling.temperature != 0:
        raise ValueError("batched eval decoding is greedy; got a sampling temperature")
    if not appended:
        return AnswerRequest(
            compressed, compressed.next_logits, compressed.prompt_len, 0.0, sampling, settled
        )
    device = compressed.next_logits.device
    start = clock(device)
    ids = torch.tensor([appended], device=device)
    next_logits = append_tokens(model, compressed.cache, ids, compressed.prompt_len)
    seconds = clock(device) - start
    return AnswerRequest(
        compressed, next_logits, compressed.prompt_len + len(appended), seconds, sampling, settled
    )


Done = Callable[[Generation], None]


class AnswerBatches:
    """Collects :class:`AnswerRequest` s and decodes them in batches of up to ``batch_size`` rows.

    A batch is decoded as soon as ``batch_size`` requests of one stackable layout are waiting, so at most
    one partial batch per layout is held; :meth:`flush` decodes the rest. Each request's ``done`` callback
    gets its :class:`~lkv.eviction.records.Generation` (``decode_s``: the row's share of each step).

    Args:
        model: the model every cache belongs to.
        tokenizer: decodes answers and checks stop strings.
        eos_token_ids: tokens that end an answer.
        batch_size: rows per forward pass (1: one answer at a time, as :meth:`Compressor.decode` does).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: list[int],
        batch_size: int,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.batch_size = batch_size
        self.waiting: dict[tuple[Hashable, tuple[int, ...] | None], list[tuple[AnswerRequest, Done]]] = {}

    def add(self, request: AnswerRequest, done: Done, group: Hashable = None) -> None:
        """Queue ``request``; ``done(generation)`` is called once it is decoded.

        Args:
            group: requests of different groups never share a batch (e.g. the budget: caches of one budget
                have one length, so a batch of them needs no padding).
        """
        group = self.waiting.setdefault((group, stack_layout(request.compressed.cache)), [])
        group.append((request, done))
        if len(group) >= self.batch_size:
            self._decode(group)
            group.clear()

    def flush(self) -> None:
        """Decode every waiting request (longest caches first, so similar lengths share a batch)."""
        for group in self.waiting.values():
            group.sort(key=lambda item: -item[0].compressed.cache.layers[0].keys.shape[2])
            for start in range(0, len(group), self.batch_size):
                self._decode(group[start : start + self.batch_size])
        self.waiting.clear()

    def _decode(self, batch: list[tuple[AnswerRequest, Done]]) -> None:
        requests = [request for request, _ in batch]
        for row, generation, _ in decode_batch(self.model, self.tokenizer, self.eos_token_ids, requests):
            batch[row][1](generation)


# Not wrapped in torch.no_grad(): its generator wrapper would hold each yielded prompt cache until the next
# row (greedy_batch decodes without gradients).
def decode_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: list[int],
    requests: Iterable[AnswerRequest],
    lengths: Sequence[int] | None = None,
    keep_prompt: bool = False,
) -> Iterator[tuple[int, Generation, DynamicCache | None]]:
    """Decode ``requests`` as one batch; yields ``(row, generation, prompt cache)`` as each answer ends.

    Each request's cache is copied into one stacked cache (:func:`~lkv.core.batched_generation.stack_caches`)
    and taken from the request (set to None) once copied.

    Args:
        requests: a list, or (with ``lengths``) a generator: then each request's cache is copied and let go
            before the next request is made, so the stack and one request's cache are all that is held.
        lengths: the entries of each request's cache (uniform layers), known before the requests are made.
        keep_prompt: yield each row's cached entries as of its first answer token (a copy cut out of the
            stack: the prompt, plus an appended question), else None. The caller should let it go before
            asking for the next row: decoding goes on meanwhile.
    """
    taken: list[AnswerRequest] = []
    logits: list[torch.Tensor] = []
    positions: list[int] = []

    def caches() -> Iterator[DynamicCache]:
        for request in requests:
            taken.append(request)
            logits.append(request.next_logits)
            positions.append(request.position)
            yield request.compressed.cache
            request.compressed.cache = None  # the stacked copy holds the entries now

    padded = stack_caches(caches(), logits, positions, lengths)
    stoppers = [StopStrings(tokenizer, r.sampling.stop) if r.sampling.stop else None for r in taken]
    rules = [_rule(tokenizer, r, s) for r, s in zip(taken, stoppers, strict=True)]
    limits = [r.sampling.max_new_tokens for r in taken]
    for finished in greedy_batch(model, padded, limits, eos_token_ids, rules, keep_prompt=keep_prompt):
        row = finished.row
        generation = _generation(
            tokenizer, eos_token_ids, taken[row], stoppers[row], finished.tokens, finished.seconds
        )
        yield row, generation, finished.prompt_cache
        finished.prompt_cache = None


def _rule(
    tokenizer: PreTrainedTokenizerBase, request: AnswerRequest, stopper: StopStrings | None
) -> Callable[[list[int]], bool] | None:
    if request.settled is None:
        return stopper
    settled = request.settled

    def rule(tokens: list[int]) -> bool:
        if stopper is not None and stopper(tokens):
            return True
        return settled(tokenizer.decode(tokens, skip_special_tokens=True))

    return rule


def _generation(
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: list[int],
    request: AnswerRequest,
    stopper: StopStrings | None,
    tokens: list[int],
    seconds: float,
) -> Generation:
    text, reason = answer_text(tokenizer, tokens, eos_token_ids, stopper)
    if reason == "length" and request.settled is not None and request.settled(text):
        reason = "answered"  # the task's score can no longer change (it may coincide with the limit)
    return answer_record(
        request.compressed, text, tokens, reason, request.position, request.question_s, seconds
    )
