"""Per-query attention rows on every cached key, for policies that decide per step (H2O, Scissorhands).

:class:`~lkv.core.attention.ImportanceCapture` reduces a block's attention to one normalised distribution over
the first ``S`` keys. A decode-time policy needs more: the raw attention of each query (a decode step, or
each token of an appended block) on *every* key of each layer — layers may hold different numbers of
entries once they have been evicted — and, for Scissorhands, each query's row on its own so that it can be
compared with that query's average ``1 / n``.
"""

from __future__ import annotations

import torch

from lkv.core.attention import ImportanceCapture, grouped_attention


class AttentionRows(ImportanceCapture):
    """Keeps, per layer, the attention rows of the last ``last_queries`` queries of one forward pass.

    ``rows(layer)`` is ``(batch, kv_heads, n, K_l)``: for each kept query, softmax attention on each of the
    layer's ``K_l`` keys, averaged over the query heads of the KV head's GQA group (each row sums to 1; a
    query's row is 0 on keys it may not see). The parent's running sums over the first ``num_keys`` keys
    are kept too, so :meth:`scores` means what it means for :class:`ImportanceCapture`.

    One capture serves one forward pass (rows of different passes have different key counts).

    Args:
        num_keys: ``S`` for :meth:`scores` (the rows always cover every key).
        last_queries: rows kept per layer (the last ``n`` queries of the block); ``None`` keeps all of them.
    """

    def __init__(self, num_keys: int = 1, last_queries: int | None = None) -> None:
        super().__init__(num_keys, last_queries)
        self._rows: dict[int, torch.Tensor] = {}

    def observe(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
    ) -> None:
        """Compute the rows of one layer (shapes as in :meth:`ImportanceCapture.observe`)."""
        if layer_idx in self._rows:
            raise RuntimeError(
                f"layer {layer_idx} was observed twice: an AttentionRows capture serves one forward pass"
            )
        first = self.first_query(layer_idx, query, key)
        probs = grouped_attention(query, key.float(), attention_mask, scaling, first, query.shape[2])
        rows = probs.mean(dim=2)  # (batch, kv_heads, n, K)
        self._rows[layer_idx] = rows
        # ImportanceCapture's sums: attention mass summed over queries and the group's heads.
        sums = probs[..., : self.num_keys].sum(dim=(2, 3))
        previous = self._sums.get(layer_idx)
        self._sums[layer_idx] = sums if previous is None else previous + sums

    def rows(self, layer_idx: int) -> torch.Tensor:
        """``(batch, kv_heads, n, K_l)`` attention rows of layer ``layer_idx``."""
        if layer_idx not in self._rows:
            raise RuntimeError(
                f"layer {layer_idx} was not observed: was the model prepared with lkv.core.attention.install_capture() "
                "and the forward pass given this capture?"
            )
        return self._rows[layer_idx]
