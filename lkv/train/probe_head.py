"""What trains a per-token probe (:class:`~lkv.model.probe.ImportanceProbe`), alone or beside a lookahead module.

:class:`~lkv.train.probe_module.ProbeModule` trains a probe alone; :class:`~lkv.train.module.LookaheadKVModule`
with ``probe:`` set (:class:`ProbeSettings`) trains one beside its lookahead module on the same prefill. Both
build it with :func:`build_probe` and train it with :func:`probe_loss`, so a probe trains the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.metrics import importance_kl
from lkv.core.reconstruction import kvzip_plus_scores, reconstruction_block
from lkv.model.backbone import ModelSignature
from lkv.model.probe import TARGETS, ImportanceProbe
from lkv.train.optim import OptimSettings, as_settings

# KVzap trains its probes with AdamW at lr 5e-3
PROBE_OPTIM = OptimSettings(lr=5e-3)


@dataclass(frozen=True)
class ProbeSettings:
    """A probe trained beside a lookahead module (``model.probe``), on the same prefill and labels.

    Attributes:
        hidden_dim: the MLP's hidden width (KVzap: 512); 0 for a linear probe.
        target: ``labels`` (KL to s_GT) or ``kvzip`` (MSE to the KVzip+ log-scores, KVzap's recipe).
        seed: seed of the probe's initial weights.
        preset: the eviction preset the pair is meant to run with, recorded in the exported adapter's
            ``extra["preset"]`` (``lkv export``).
        optim: the probe's own AdamW settings and schedule (its own parameter group).
    """

    hidden_dim: int = 512
    target: Literal["labels", "kvzip"] = "labels"
    seed: int = 0
    preset: str = "long"
    optim: OptimSettings = field(default_factory=lambda: PROBE_OPTIM)

    def __post_init__(self) -> None:
        object.__setattr__(self, "optim", as_settings(self.optim, OptimSettings, "model.probe.optim"))
        check_probe_settings(self.hidden_dim, self.target, "model.probe.")


# in checkpoints' hyper-parameters, as OptimSettings (lkv.train.optim)
torch.serialization.add_safe_globals([ProbeSettings])


def check_probe_settings(hidden_dim: int, target: str, where: str) -> None:
    """Raise one clear error for a probe width or target that cannot be built (``where``: the key prefix)."""
    if target not in TARGETS:
        raise ValueError(f"{where}target: expected one of {', '.join(TARGETS)}, found {target!r}")
    if hidden_dim < 0:
        raise ValueError(f"{where}hidden_dim: expected ≥ 0 (0: a linear probe), found {hidden_dim}")


def build_probe(
    backbone: PreTrainedModel, signature: ModelSignature, hidden_dim: int, target: str, seed: int
) -> ImportanceProbe:
    """A fresh probe for ``backbone``'s shape on its device, naming its signature; the global random stream
    is left as it was (the probe seeds its own initialisation), so a module trained beside it draws the same."""
    device = next(backbone.parameters()).device
    with torch.random.fork_rng(devices=[]):
        probe = ImportanceProbe.create(backbone, hidden_dim, target, seed).to(device)
    probe.config.base_model = signature.to_dict()
    return probe


def probe_loss(
    target: str,
    logits: torch.Tensor,
    truth: torch.Tensor,
    backbone: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    cache,
) -> torch.Tensor:
    """One sample's probe loss.

    Args:
        target: ``labels``: mean over (layer, KV head) of KL(s_GT ‖ softmax_S(logits)); ``kvzip``: the mean
            squared error of the logits to the KVzip+ log-scores of a "repeat the context" pass of ``backbone``
            on ``cache`` (keys that got no attention at all are left out).
        logits, truth: ``(layers, kv_heads, S)`` the probe's logits and s_GT.
        prompt_ids: ``(S,)`` the prompt; ``cache``: its prefill cache (cropped back to ``S``).
    """
    if target == "labels":
        return importance_kl(truth, torch.softmax(logits, dim=-1)).mean()
    block = reconstruction_block(tokenizer, prompt_ids.tolist())
    block_ids = torch.tensor([block], device=prompt_ids.device)
    wanted = kvzip_plus_scores(backbone, cache, prompt_ids.numel(), block_ids, repeated=prompt_ids.numel())
    seen = wanted.isfinite()
    return F.mse_loss(logits[seen], wanted[seen])
