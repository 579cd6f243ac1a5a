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

from lkv.core.attention import AttentionCapture, query_blocks
from lkv.core.chat import chat_parts
from lkv.core.compat import cache_kwargs
from lkv.core.generation import crop_to
from lkv.core.reconstruction import REPEAT_INSTRUCTION
from lkv.eviction.presses.base import Press, PressContext

# the same sentence as the probe's KVzip+ targets (lkv.core.reconstruction), as a new paragraph
REPEAT_PROMPT = "\n\n" + REPEAT_INSTRUCTION
REPEAT_PART_PROMPT = "\n\nRepeat the part of the previous context exactly, starting with"


class ReconstructionCapture(AttentionCapture):
    """The largest attention a reconstruction block's queries pay to each entry of one context chunk.

    In every layer the block's queries attend (softmax) over the sink's ``sink`` keys, the chunk's keys
    ``start..end`` and the block's own keys (causally); the rest of the cache is left out of the normalisation.

    Args:
        num_keys: ``S``, the prompt length (the cache holds ``S`` entries before the block).
        sink: leading prompt entries that take part in every chunk's softmax.
        start, end: the chunk's prompt positions.
    """

    def __init__(self, num_keys: int, sink: int, start: int, end: int) -> None:
        super().__init__(num_keys)
        if not 0 <= sink <= start < end <= num_keys:
            raise ValueError(f"expected 0 ≤ sink ≤ start < end ≤ S, got {sink}, {start}, {end}, S={num_keys}")
        self.sink, self.start, self.end = sink, start, end
        self.chunk_scores: dict[int, torch.Tensor] = {}

    def observe(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        value: torch.Tensor | None = None,
    ) -> None:
        """Shapes as in :meth:`lkv.core.attention.ImportanceCapture.observe`; ``key`` holds ``S`` + the block."""
        batch, heads, q_len, head_dim = query.shape
        if key.shape[2] != self.num_keys + q_len:
            raise ValueError(
                f"layer {layer_idx}: {key.shape[2]} keys, expected the prompt's {self.num_keys} + the block's {q_len}"
            )
        keys = torch.cat(
            [key[:, :, : self.sink], key[:, :, self.start : self.end], key[:, :, -q_len:]], dim=2
        )
        keys = keys.float()
        kv_heads, width = keys.shape[1], keys.shape[2]
        chunk = slice(self.sink, self.sink + self.end - self.start)
        best = None
        for first, stop in query_blocks(0, q_len, batch * heads * width):
            grouped = query[:, :, first:stop].reshape(
                batch, kv_heads, heads // kv_heads, stop - first, head_dim
            )
            # fp32 even under bf16 autocast (the scores of ~S keys are small); the block's causal mask is applied
            # in place to its own columns only (the sink and the chunk are visible to every query)
            with torch.autocast(query.device.type, enabled=False):
                logits = torch.einsum("bkgqd,bknd->bkgqn", grouped.float(), keys) * scaling
                rows = torch.arange(first, stop, device=keys.device)[:, None]
                later = torch.arange(q_len, device=keys.device)[None, :] > rows
                logits[..., width - q_len :].masked_fill_(later, float("-inf"))
                part = torch.softmax(logits, dim=-1)[..., chunk].amax(dim=(2, 3))
            best = part if best is None else torch.maximum(best, part)
        self.chunk_scores[layer_idx] = best

    def layer_scores(self, num_layers: int) -> torch.Tensor:
        """``(batch, layers, kv_heads, end - start)`` scores of the chunk."""
        if sorted(self.chunk_scores) != list(range(num_layers)):
            raise RuntimeError(
                f"the reconstruction block was observed in layers {sorted(self.chunk_scores)}, expected "
                f"0..{num_layers - 1}: was the model prepared with lkv.core.attention.install_capture()?"
            )
        return torch.stack([self.chunk_scores[layer] for layer in range(num_layers)], dim=1)


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
            capture = ReconstructionCapture(ctx.prompt_len, sink, start, end)
            try:
                ctx.model.get_decoder()(
                    input_ids=block, **cache_kwargs(ctx.cache), use_cache=True, lkv_capture=capture
                )
            finally:
                crop_to(ctx.cache, ctx.prompt_len)
            scores[..., start:end] = capture.layer_scores(num_layers)
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
