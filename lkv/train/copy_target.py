"""The copy-boosted training target (``model.copy_boost``): more of s_GT on the prompt spans the response copies.

A retrieval answer reads a key phrase and then copies the value that follows it. Where the module must keep
both in ``C`` entries per head, a target whose mass sits mostly on the question-matching key phrase teaches it
to rank that phrase above the value: at small ``C`` the value is evicted from the heads the answer copies it
from while the phrase is kept (the needle-token diagnostic, docs/evaluation.md). The boost moves a share of
every (layer, KV head) row's mass onto the prompt tokens the response reproduces verbatim, equally per token,
so every head's top-``C`` of the target holds them.

A copied token is one inside a run of at least :data:`MIN_TOKENS` consecutive prompt tokens that the response
holds in the same order. A run that occurs at more than :data:`MAX_SITES` places of the prompt (a common phrase,
a repeated header) marks none of them: it names no one place to keep. The rule reads token ids only, so it works
for any label (the labeller's own response or a teacher-forced reference) without knowing the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Three tokens: a value of one or two tokens (a short number) matches too many places by chance to mark one.
MIN_TOKENS = 3
# A run found twice is a fact and its restatement (a needle and the question naming its key); more is boilerplate.
MAX_SITES = 2


def copied_positions(
    prompt_ids: Sequence[int] | torch.Tensor, response_ids: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """``(S,)`` bool: the prompt positions inside a run of ≥ :data:`MIN_TOKENS` tokens that the response
    reproduces, counting only runs found at ≤ :data:`MAX_SITES` places of the prompt (module docstring)."""
    prompt = [int(t) for t in prompt_ids]
    response = [int(t) for t in response_ids]
    copied = torch.zeros(len(prompt), dtype=torch.bool)
    sites: dict[tuple[int, ...], list[int]] = {}
    for start in range(len(prompt) - MIN_TOKENS + 1):
        sites.setdefault(tuple(prompt[start : start + MIN_TOKENS]), []).append(start)
    for start in range(len(response) - MIN_TOKENS + 1):
        found = sites.get(tuple(response[start : start + MIN_TOKENS]), [])
        if len(found) <= MAX_SITES:  # longer runs are covered by their overlapping MIN_TOKENS-grams
            for site in found:
                copied[site : site + MIN_TOKENS] = True
    return copied


def copy_boosted(target: torch.Tensor, copied: torch.Tensor, boost: float) -> torch.Tensor:
    """``(1 − boost) · target + boost · copied / |copied|`` per row: ``(..., S), (S,) → (..., S)``, each row still
    summing to 1; ``target`` itself where nothing is copied or ``boost`` is 0."""
    if boost == 0 or not copied.any():
        return target
    uniform = copied.to(target.dtype) / copied.sum()
    return (1 - boost) * target + boost * uniform.to(target.device)
