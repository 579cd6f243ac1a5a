"""Scissorhands (Liu et al., 2023): persistence of importance over a history window.

A token is *important* to a query if the attention it receives exceeds that query's average, ``1 / n``
over the ``n`` keys the query sees. Over the last ``history`` queries, each cached entry counts how often
it was *not* important; when the cache is over its budget the entries that stayed unimportant most often
are dropped, the most recent ones excepted. Per KV head, the attention of the query heads of its GQA group
is averaged (as everywhere in lkv).

The prompt's eviction uses the same rule with the prompt's last ``history`` queries as the history
(:class:`ScissorhandsPress`). While decoding the window then fills with generated tokens' queries; only the
prompt window's count per entry is carried over, so its share of the window fades out linearly: after
``t`` decoding steps it contributes ``(history - t) / history`` of its count (exact at ``t = 0`` and from
``t = history`` on).
"""

from __future__ import annotations

import torch

from lkv.eviction.decoding.base import DecodeStart, EvictionPolicy
from lkv.eviction.decoding.capture import AttentionRows
from lkv.eviction.presses.base import Press, PressContext


def unimportant(rows: torch.Tensor) -> torch.Tensor:
    """Which keys each query found unimportant: attention at most ``1 / n`` over the ``n`` keys it sees.

    Args:
        rows: ``(..., q, K)`` attention of the last ``q`` queries of a causal block ending at key ``K - 1``
            (query ``i`` sees keys ``0 .. K - q + i``).

    Returns:
        ``(..., q, K)`` bool; keys a query cannot see are not counted.
    """
    q_len, k_len = rows.shape[-2:]
    seen = torch.arange(k_len - q_len + 1, k_len + 1, device=rows.device)  # keys each query sees
    visible = torch.arange(k_len, device=rows.device)[None, :] < seen[:, None]
    return (rows <= 1.0 / seen[:, None]) & visible


class ScissorhandsPress(Press):
    """Prompt scores: minus how often each token was unimportant to the prompt's last ``history`` queries.

    Args:
        history: the history window (queries).
    """

    name = "scissorhands-prefill"

    def __init__(self, history: int = 16) -> None:
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValueError(f"history must be a whole number ≥ 1, got {history!r}")
        self.history = history

    def prefill_capture(self, prompt_len: int) -> AttentionRows:
        return AttentionRows(num_keys=prompt_len, last_queries=self.history)

    def score(self, ctx: PressContext) -> torch.Tensor:
        if not isinstance(ctx.capture, AttentionRows):
            raise TypeError(
                f"Scissorhands needs its own AttentionRows prefill capture, got {type(ctx.capture).__name__}: a "
                "shared prefill must not replace it by another method's capture with the same window"
            )
        layers = ctx.model.config.num_hidden_layers
        counts = [unimportant(ctx.capture.rows(layer)).sum(dim=2) for layer in range(layers)]
        return -torch.stack(counts, dim=1).float()

    def window_queries(self, prompt_len: int) -> int:
        """Prompt queries the counts are over."""
        return min(self.history, prompt_len)


class ScissorhandsDecode(EvictionPolicy):
    """Scissorhands' eviction rule, applied at every decoding step.

    Args:
        budget: entries per KV head (default: the prompt's compression budget).
        every: evict every ``every`` generated tokens, ``every`` entries at a time (the paper's drop amount).
        recent: most recent entries always kept: a count or a fraction of the budget (default 0.5, as for
            H2O, so that the two differ only in how they rank the rest).
        history: the history window (queries).
    """

    name = "scissorhands"

    def __init__(
        self, budget: int | None = None, every: int = 1, recent: int | float = 0.5, history: int = 16
    ) -> None:
        super().__init__(budget, every, recent)
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValueError(f"{self.name}: history must be a whole number ≥ 1, got {history!r}")
        self.history = history

    def initial_state(
        self, start: DecodeStart, layer: int, positions: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        kv_heads, entries = positions.shape[1:]
        prompt = torch.zeros(1, kv_heads, entries, device=positions.device)
        if isinstance(start.press, ScissorhandsPress) and start.scores is not None:
            counts = -start.scores[0, layer].to(positions.device).float().gather(-1, positions[0])
            prompt = (counts / start.press.window_queries(start.prompt_len))[None]
        return {
            # Unimportance of each entry to each of the last ``history`` observed queries (oldest first).
            "history": torch.zeros(1, kv_heads, 0, entries, dtype=torch.bool, device=positions.device),
            # Fraction of the prompt window's queries to which the entry was unimportant.
            "prompt": prompt,
        }

    def update(self, state: dict[str, torch.Tensor], rows: torch.Tensor) -> None:
        state["history"] = torch.cat([state["history"], unimportant(rows)], dim=2)[:, :, -self.history :]

    def priority(self, state: dict[str, torch.Tensor], steps: int) -> torch.Tensor:
        counts = state["history"].sum(dim=2) + state["prompt"] * max(self.history - steps, 0)
        return -counts
