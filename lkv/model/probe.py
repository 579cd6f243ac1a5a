"""A learned per-token importance probe (KVzap-style): per layer a small network on each token's hidden state.

KVzap (arXiv:2601.07891; NVIDIA kvpress's ``KVzapPress`` and ``kvzap/train.py``) predicts, for every prompt
token and KV head, how much the token's KV pair will be needed, from that token's hidden state alone: per
layer ``l`` a linear layer or a one-hidden-layer MLP maps the attention input ``x_l[j]`` (the hidden state
after the layer's input norm, the input of its q/k/v projections) to one logit per KV head,

    z[l, h, j] = f_l(x_l[j])[h],      f_l = Linear(hidden → kv_heads)
                                        or Linear(hidden → hidden_dim) → GELU → Linear(hidden_dim → kv_heads)

(KVzap's ``linear`` and ``mlp`` models; its MLP has ``hidden_dim = 512``). A prompt token's hidden state sees
only the tokens before it, so the probe is question-agnostic by construction, and it costs one small matrix
product per layer during the prefill. The scores are ``softmax over S`` of the logits per (layer, KV head):
the predicted importance distribution, trained against s_GT with the KL loss of LookaheadKV (``target:
labels``) or, as KVzap trains it, by regressing the logits on the KVzip+ log-scores (``target: kvzip``,
:mod:`lkv.core.reconstruction`).

An exported folder (:meth:`ImportanceProbe.save`) holds::

    probe.json          settings + the base model's signature
    probe.safetensors   the per-layer weights, float32
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from lkv import __version__
from lkv.core.files import check_safetensors, follow_umask

PROBE_CONFIG_FILE = "probe.json"
PROBE_WEIGHTS_FILE = "probe.safetensors"
# the sub-folder of an exported lookahead module's folder that holds the probe trained (and meant to run) with it
PROBE_SUBFOLDER = "probe"
TARGETS = ("labels", "kvzip")


@dataclass
class ProbeConfig:
    """Settings of a probe, stored as ``probe.json`` beside its weights.

    Attributes:
        num_layers, hidden_size, num_kv_heads: the base model's shape (per layer a network hidden → KV heads).
        hidden_dim: width of the MLP's hidden layer; 0 for a linear probe.
        target: what it was trained on: ``labels`` (s_GT, KL) or ``kvzip`` (KVzip+ log-scores, MSE).
        seed: seed of the initial weights.
        base_model: the base model's signature (:meth:`lkv.model.backbone.ModelSignature.to_dict`), if known.
        extra: free-form (``extra["model"]``: the base model's name, so loading needs no ``--model``).
    """

    num_layers: int
    hidden_size: int
    num_kv_heads: int
    hidden_dim: int = 512
    target: str = "labels"
    seed: int = 0
    base_model: dict[str, Any] | None = None
    lkv_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)


def read_probe_config(folder: str | Path) -> ProbeConfig:
    """The :class:`ProbeConfig` of an exported probe folder.

    Raises:
        FileNotFoundError: without ``probe.json``, naming what the folder holds instead (an adapter).
        ValueError: for a malformed ``probe.json``.
    """
    folder = Path(folder)
    path = folder / PROBE_CONFIG_FILE
    if not path.is_file():
        found = ""
        if (folder / "lookahead.json").is_file():
            found = " It holds a LookaheadKV adapter (lookahead.json): pass it as --adapter instead."
        raise FileNotFoundError(
            f"{path}: not found — is {folder} a probe folder (`lkv export` of a probe checkpoint)?{found}"
        )
    try:
        return ProbeConfig(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: malformed probe config ({err})") from err


class ImportanceProbe(nn.Module):
    """One network per layer: attention input ``(batch, S, hidden)`` → logits ``(batch, kv_heads, S)``.

    Build with :meth:`create` (training) or :meth:`load` (an exported folder). The weights are float32
    whatever the base model's dtype; hidden states are cast to float32 first.
    """

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__()
        if config.target not in TARGETS:
            raise ValueError(f"probe target must be one of {', '.join(TARGETS)}, got {config.target!r}")
        if config.hidden_dim < 0:
            raise ValueError(f"probe hidden_dim must be ≥ 0 (0: linear), got {config.hidden_dim}")
        self.config = config
        self.layers = nn.ModuleList(self._network(config) for _ in range(config.num_layers))

    @staticmethod
    def _network(config: ProbeConfig) -> nn.Module:
        if config.hidden_dim == 0:
            return nn.Linear(config.hidden_size, config.num_kv_heads)
        return nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_dim),
            nn.GELU(),
            nn.Linear(config.hidden_dim, config.num_kv_heads),
        )

    @classmethod
    def create(
        cls, model: PreTrainedModel, hidden_dim: int = 512, target: str = "labels", seed: int = 0
    ) -> ImportanceProbe:
        """A fresh probe for ``model``'s shape, initialised from ``seed`` (PyTorch's default layer init)."""
        config = model.config.get_text_config()
        torch.manual_seed(seed)
        return cls(
            ProbeConfig(
                num_layers=config.num_hidden_layers,
                hidden_size=config.hidden_size,
                num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                hidden_dim=hidden_dim,
                target=target,
                seed=seed,
            )
        )

    @classmethod
    def load(cls, folder: str | Path, model: PreTrainedModel) -> ImportanceProbe:
        """Rebuild a probe saved by :meth:`save` (an ``lkv export`` folder) for ``model``: its shape checked,
        the weights on its device, frozen."""
        folder = Path(folder)
        config = read_probe_config(folder)
        probe = cls(config)
        probe.check_model(model, str(folder))
        path = folder / PROBE_WEIGHTS_FILE
        check_safetensors(path, "the probe's weights")
        state = load_file(str(path))
        missing = sorted(set(probe.state_dict()) - set(state))
        unexpected = sorted(set(state) - set(probe.state_dict()))
        if missing or unexpected:
            raise ValueError(
                f"{path}: does not match {PROBE_CONFIG_FILE} (hidden_dim={config.hidden_dim}, "
                f"{config.num_layers} layers): missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        probe.load_state_dict(state)
        return probe.to(next(model.parameters()).device).eval().requires_grad_(False)

    def save(self, folder: str | Path) -> None:
        """Write the standalone probe folder (``probe.json`` + ``probe.safetensors``)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            name: tensor.detach().float().cpu().contiguous() for name, tensor in self.state_dict().items()
        }
        save_file(state, str(folder / PROBE_WEIGHTS_FILE))
        follow_umask(folder / PROBE_WEIGHTS_FILE)
        (folder / PROBE_CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2, sort_keys=True))

    def check_model(self, model: PreTrainedModel, where: str = "the probe") -> None:
        """Raise a clear error unless ``model`` has the layers, hidden size and KV heads of the probe."""
        config = model.config.get_text_config()
        found = (
            config.num_hidden_layers,
            config.hidden_size,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        )
        expected = (self.config.num_layers, self.config.hidden_size, self.config.num_kv_heads)
        if found != expected:
            raise ValueError(
                f"{where}: the probe was trained for (layers, hidden size, KV heads) = {expected}, the given "
                f"model has {found}"
            )

    def layer_logits(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of one layer: ``hidden (batch, S, hidden)`` → ``(batch, kv_heads, S)`` float32."""
        return self.layers[layer_idx](hidden.float()).transpose(1, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """All layers' logits: ``hidden (batch, layers, S, hidden)`` → ``(batch, layers, kv_heads, S)``."""
        return torch.stack([self.layer_logits(i, hidden[:, i]) for i in range(len(self.layers))], dim=1)
