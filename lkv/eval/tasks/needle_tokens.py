"""Needle-token retention, prefill only: the share of the asked value's tokens each (layer, KV head) keeps.

End-task retention needs an answer decoded per (method, budget); this diagnostic needs none, so it covers many
more samples for the same CPU time. For each needle sample it finds the prompt positions of the asked value
(the digits of "7321945", the words of a passphrase), lets every method score the prompt once, and asks, per
budget ``C`` and per (layer, KV head), how many of those positions the method's top-``C`` keeps — the same
selection an eviction would make (protected windows, per-layer budgets, pooling). A mean Recall@C over all
heads is dominated by sink and recent tokens; this one is not.

Each row's ``score`` is the mean share over (layer, KV head); ``metrics`` add ``heads_all`` (heads keeping
every value token), ``heads_any`` (heads keeping at least one) and ``per_head`` (``layers × kv_heads`` shares,
layer-major), so a report can tell whether a few retrieval heads lose the needle or all heads do. Each sample's
full-cache answer is decoded once (greedy): ``fullkv_score`` says whether FullKV finds the needle at all, and
the Oracle's scores are that answer's attention (teacher-forced on the full cache), as in ``lkv eval``'s end
tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lkv.core.chat import chat_parts
from lkv.eval.tasks.base import Benchmark, Sample
from lkv.eval.tasks.generalise import GeneraliseTask
from lkv.eval.tasks.needle_families import NeedleFamilyTask

if TYPE_CHECKING:  # torch loads at run time, so `lkv eval --help` lists this task at once
    import torch
    from transformers import PreTrainedTokenizerBase

    from lkv.eval.prompt_settings import Setting


def value_positions(sample: Sample, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Prompt positions of the tokens that spell the asked values (``sample.answers``) in the context.

    A token counts when its characters overlap the value's first occurrence in the context, so a value split
    across tokens (one per digit in SmolLM2) gives all of them. Positions index the context ids of
    :func:`lkv.eval.tasks.base.encode_sample`, which start the prompt.
    """
    prefix = chat_parts(tokenizer)[0] if sample.chat else ""
    text = prefix + sample.context
    encoded = tokenizer(text, add_special_tokens=not sample.chat, return_offsets_mapping=True)
    positions: set[int] = set()
    for value in sample.answers:
        start = text.find(value, len(prefix))
        if start < 0:
            raise ValueError(f"sample {sample.id}: the answer {value!r} does not occur in its context")
        end = start + len(value)
        positions |= {i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < end and b > start}
    return sorted(positions)


def kept_share(kept: Sequence[torch.Tensor], positions: Sequence[int]) -> torch.Tensor:
    """Per (layer, KV head), the share of ``positions`` among the kept ones.

    Args:
        kept: per layer, ``(1, kv_heads, C_l)`` kept prompt positions (the selector's output).
        positions: the value's prompt positions.

    Returns:
        ``(layers, kv_heads)`` float32 shares in ``[0, 1]``.
    """
    if not positions:
        raise ValueError("no value positions to look for")
    import torch

    wanted = torch.tensor(list(positions), device=kept[0].device)
    hits = [torch.isin(index[0], wanted).sum(dim=-1) for index in kept]  # (kv_heads,) per layer
    return torch.stack(hits).float() / len(positions)


def share_metrics(share: torch.Tensor) -> dict[str, float]:
    """A row's metrics from ``(layers, kv_heads)`` shares (see the module docstring)."""
    return {
        "value_kept": share.mean().item(),
        "heads_all": (share >= 1.0).float().mean().item(),
        "heads_any": (share > 0.0).float().mean().item(),
    }


def held_in_oracle_heads(oracle: Sequence[float], mine: Sequence[float]) -> tuple[int, int]:
    """Per-head value shares (``per_head`` of two needle-token rows of one sample and budget: the Oracle's and a
    method's, ``layers × kv_heads`` each) → (heads where the Oracle keeps every value token and the method does
    too, heads where the Oracle does). The Oracle's heads are those the answer reads the value from; a mean
    share over all heads is dominated by heads that never attend to it."""
    heads = [i for i, share in enumerate(oracle) if share >= 1.0]
    return sum(mine[i] >= 1.0 for i in heads), len(heads)


class NeedleTokenTask(Benchmark):
    """The needle-token diagnostic over the samples of a needle task (question-aware only).

    Args:
        needles: the needle task whose samples are scored: a :class:`NeedleFamilyTask` (families, lengths,
            depths or ``distances``) or a :class:`GeneraliseTask` (many text sources and fact kinds, measured
            distances; with ``screened_by`` the FullKV-solved needles an end-task run evaluates, so both rows
            pair by sample). Its answers are decoded only for the Oracle's scores, one FullKV answer per sample.
    """

    metric = "value_kept"
    fixed_setting: Setting | None = "aware"

    def __init__(self, needles: NeedleFamilyTask | GeneraliseTask) -> None:
        self.needles = needles
        self.name = f"{needles.name}_tokens"

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        return self.needles.samples(tokenizer)
