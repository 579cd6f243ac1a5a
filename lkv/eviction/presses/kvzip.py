"""KVzip (Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"): the
context is scored by how much attention the model pays to it while repeating it.

After the prompt's prefill, a *reconstruction* block — the repeat prompt ("Repeat the previous context
exactly."), the chat template's closing, then the context itself, teacher-forced — runs on top of the full
cache. The score of a context entry of KV head ``h`` is the largest attention any reconstruction query of
``h``'s GQA group pays it. The context is reconstructed in chunks of ``chunk_size`` tokens (each chunk's
block starts with "Repeat the part of the previous context exactly, starting with" and the previous chunk's
last ``overlap`` tokens); a chunk's attention is normalised over the system prompt, the chunk and the block
itself, as in the paper's chunked scoring. The chat template's opening (the system prompt) is the
attention sink: it is never evicted. No question is needed, so one compressed cache serves any question; the
price is a second pass over the context (TTFT ×2–3, as the paper states).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from lkv.core.chat import chat_parts
from lkv.core.compat import cache_kwargs
from lkv.core.generation import crop_to
from lkv.core.reconstruction import REPEAT_INSTRUCTION, ReconstructionCapture
from lkv.eviction.presses.base import Press, PressContext

# the same sentence as the probe's KVzip+ targets (lkv.core.reconstruction), as a new paragraph
REPEAT_PROMPT = "\n\n" + REPEAT_INSTRUCTION
REPEAT_PART_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"


class KVzipPress(Press):
    """KVzip's scores (the paper's and NVIDIA kvpress's settings): chunks of 2,048 context tokens, an overlap
    of 8 tokens between chunks, the system prompt as sink.

    The tokenizer (:attr:`PressContext.tokenizer`) writes the repeat prompts and the chat template's parts. The
    sink is the template's opening when the prompt starts with it (the paper keeps the system prompt; kvpress's
    ``KVzipPress`` keeps ``n_sink = 4`` leading tokens instead and scores the rest of the opening 0, the
    convention docs/kvpress.md compares), else nothing. Scores need the whole prompt first: no streaming.

    Args:
        chunk_size: context tokens reconstructed per pass.
        overlap: tokens of the previous chunk that open the next chunk's repeat prompt.
    """

    name = "kvzip"

    def __init__(self, chunk_size: int = 2048, overlap: int = 8) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if overlap < 0:
            raise ValueError(f"overlap must be ≥ 0, got {overlap}")
        self.chunk_size = chunk_size
        self.overlap = overlap

    def score_key(self) -> tuple[str, int, int]:
        return ("kvzip", self.chunk_size, self.overlap)

    @torch.no_grad()
    def score(self, ctx: PressContext) -> torch.Tensor:
        if ctx.tokenizer is None:
            raise ValueError(
                "kvzip writes its repeat prompt with the tokenizer: give the Compressor a tokenizer"
            )
        ids = ctx.prompt_ids
        sink, suffix = template_parts(ctx.tokenizer, ids[0].tolist())
        num_layers = len(ctx.cache.layers)
        kv_heads = ctx.cache.layers[0].keys.shape[1]
        scores = torch.zeros(1, num_layers, kv_heads, ctx.prompt_len, device=ids.device)
        scores[..., :sink] = float("inf")
        for start in range(sink, ctx.prompt_len, self.chunk_size):
            end = min(start + self.chunk_size, ctx.prompt_len)
            if start == sink:
                opening = encode(ctx.tokenizer, REPEAT_PROMPT)
            else:
                previous = ids[0, max(start - self.overlap, start - self.chunk_size) : start].tolist()
                opening = encode(ctx.tokenizer, REPEAT_PART_PROMPT) + previous
            block = torch.tensor([opening + suffix], device=ids.device)
            block = torch.cat([block, ids[:, start:end]], dim=1)
            # every block query counts, each softmax over the sink, the chunk and the block
            capture = ReconstructionCapture(ctx.prompt_len, window=(sink, start, end), weighted=False)
            try:
                ctx.model.get_decoder()(
                    input_ids=block, **cache_kwargs(ctx.cache), use_cache=True, lkv_capture=capture
                )
            finally:
                crop_to(ctx.cache, ctx.prompt_len)
            # the largest attention of any query head of the KV head's group
            chunk = [capture.maxima(layer).amax(dim=2) for layer in range(num_layers)]
            scores[..., start:end] = torch.stack(chunk, dim=1)
        return scores


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """``text``'s token ids, no special tokens added."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def template_parts(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> tuple[int, list[int]]:
    """``(sink, suffix_ids)``: the length of the chat template's opening if ``prompt_ids`` starts with it (else
    0), and the template's closing after a user turn (``"\\n"`` without a template, as kvpress)."""
    prefix, suffix = chat_parts(tokenizer)
    opening = encode(tokenizer, prefix) if prefix else []
    sink = len(opening) if opening and prompt_ids[: len(opening)] == opening else 0
    return sink, encode(tokenizer, suffix or "\n")
