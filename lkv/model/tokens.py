"""Learned tokens on a frozen model: ``N`` embeddings + a peft LoRA that is active only while they run.

The shared part of a lookahead module (:class:`lkv.model.lookahead.LookaheadAdapter`, whose tokens score the
prompt's positions) and a restore module (:class:`lkv.model.restore.RestoreAdapter`, whose tokens append their
K/V to an evicted cache): creating, loading and saving the embeddings and the LoRA, switching the LoRA on and
off, and what trains. Outside a subclass's own pass the LoRA is off, so the model computes exactly the base
model's and serves for prefill and decoding.

Several modules can share one frozen model (an in-run ablation, :mod:`lkv.sweep.ablation`; ``lkv eval
--adapters``; a restore module beside a lookahead module): each one's LoRA is a named peft adapter
(``adapter_name``) on the same model, and each switches its own adapter on for its own tokens only.

A saved folder (:meth:`TokenAdapter.save`; the file names are the subclass's) holds::

    <config_file>                     settings (:class:`TokenConfig`) + the base model's signature
    <embeddings_file>                 {<embeddings_key>: (N, hidden)} float32
    adapter_config.json, adapter_model.safetensors   peft LoRA files (absent for embeddings-only modules)
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from lkv import __version__
from lkv.core.files import check_safetensors, follow_umask

# peft's name of a model's first adapter; an exported folder always holds its LoRA under this name.
DEFAULT_ADAPTER = "default"
INITS = ("vocab_mean", "random_tokens", "normal")
NO_LORA = "none"
Adapter = TypeVar("Adapter", bound="TokenAdapter")


@dataclass
class TokenConfig:
    """Settings of a learned-token module, stored as its folder's config file (``lookahead.json``,
    ``restorekv.json``) beside its weights.

    Attributes:
        num_tokens: the number of learned embeddings (a lookahead module's ``M``, a restore module's ``n``).
        hidden_size: width of each embedding (the base model's hidden size).
        lora_rank, lora_alpha, lora_dropout: LoRA settings (ignored when ``target_modules`` is ``"none"``).
        target_modules: ``"all-linear"`` (q,k,v,o,gate,up,down; never lm_head), a list of module names,
            or ``"none"`` for an embeddings-only module. The last layer keeps only those whose LoRA can
            change what the tokens produce (:meth:`TokenAdapter.excluded_linears`).
        init, seed: how the embeddings were initialised.
        base_model: the base model's signature (:meth:`lkv.model.backbone.ModelSignature.to_dict`), if known.
    """

    num_tokens: int
    hidden_size: int
    lora_rank: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"
    init: str = "vocab_mean"
    seed: int = 0
    base_model: dict[str, Any] | None = None
    lkv_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_lora(self) -> bool:
        return _uses_lora(self.target_modules)


def read_token_folder(folder: Path, config_file: str, embeddings_file: str) -> TokenConfig:
    """The config of an ``lkv export`` adapter folder, after checking that its weight files are there and
    whole (the embeddings, and the peft LoRA files when the module has LoRA), before any model loads.

    Args:
        config_file, embeddings_file: the folder's file names (:class:`TokenAdapter`'s class attributes).

    Raises:
        FileNotFoundError: a missing file, named.
        ValueError: a malformed config or an unreadable safetensors file, named.
    """
    path = folder / config_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found — is {folder} a folder written by `lkv export`?")
    try:
        config = TokenConfig(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path}: malformed config ({err})") from err
    check_safetensors(folder / embeddings_file, "the learned embeddings")
    if config.uses_lora:
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{folder / 'adapter_config.json'}: not found (the peft LoRA config)")
        check_safetensors(folder / "adapter_model.safetensors", "the peft LoRA weights")
    return config


def _uses_lora(target_modules: list[str] | str) -> bool:
    if isinstance(target_modules, str):
        return target_modules != NO_LORA
    return len(target_modules) > 0


def init_embeddings(model: PreTrainedModel, num_tokens: int, init: str, seed: int) -> torch.Tensor:
    """Initial learned embeddings ``(N, hidden)`` float32, on the device of the model's input embedding table.

    ``vocab_mean``: every row is the mean token embedding (rows still differ through their positions);
    ``random_tokens``: embeddings of ``N`` seeded random vocabulary tokens;
    ``normal``: N(0, σ²) with σ the table's standard deviation.

    The random draws always come from a seeded CPU generator (one stream, whatever the device) and are then
    moved to the table's device: Lightning calls ``configure_model`` under a default-device context
    (``cuda:k``, or ``meta`` for deferred initialisation), where a factory call with a CPU generator would
    fail or land elsewhere. Nothing is read back to the host, so a ``meta`` table gives ``meta`` embeddings.
    """
    table = model.get_input_embeddings().weight.detach().float()
    gen = torch.Generator().manual_seed(seed)
    if init == "vocab_mean":
        return table.mean(dim=0, keepdim=True).expand(num_tokens, -1).clone()
    if init == "random_tokens":
        rows = torch.randint(0, table.shape[0], (num_tokens,), generator=gen, device="cpu")
        return table[rows.to(table.device)].clone()
    if init == "normal":
        draw = torch.randn(num_tokens, table.shape[1], generator=gen, device="cpu")
        return draw.to(table.device) * table.std()
    raise ValueError(f"init must be one of {INITS}, got {init!r}")


def unreachable_linears(model: PreTrainedModel, read: tuple[str, ...]) -> list[str]:
    """Names of the linear layers whose LoRA could never change what the learned tokens produce: in the last
    decoder layer, everything but the projections ``read`` (names ending so, e.g. ``("q_proj", "k_proj")``).

    No LM head runs after the tokens, so of the last layer only what the module reads counts: a lookahead
    module its attention rows (queries and keys), a restore module its keys and values. The LoRA weights of
    the other projections and the MLP would never get a gradient, and DDP would have to search the graph for
    unused parameters every step.
    """
    last = model.get_decoder().layers[-1]
    prefix = next(name for name, module in model.named_modules() if module is last)
    return [
        f"{prefix}.{name}"
        for name, module in last.named_modules()
        if isinstance(module, nn.Linear) and not name.endswith(read)
    ]


def _adapter_parameters(model: nn.Module, adapter_name: str | None = None) -> list[nn.Parameter]:
    """The parameters peft added (LoRA A/B, ...) for ``adapter_name`` (None: every adapter), found through
    peft's own bookkeeping (per layer, one dict entry per adapter name)."""
    params: list[nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            for layer_name in module.adapter_layer_names:
                layers = getattr(module, layer_name)
                for name in [adapter_name] if adapter_name is not None else list(layers.keys()):
                    if name in layers:
                        params.extend(layers[name].parameters())
    return params


@contextmanager
def _trainability_kept(model: nn.Module) -> Iterator[None]:
    """Give every adapter parameter already on ``model`` its ``requires_grad`` back after the block.

    peft flips it for the adapters a call does not name: ``set_adapter`` and ``enable/disable_adapter_layers``
    (all releases) and ``add_adapter`` (up to 0.20, which freezes the other inactive adapters). Trainability
    is this module's to decide (DDP registers the parameters that require grad once, while the adapter is off).
    """
    before = [(p, p.requires_grad) for p in _adapter_parameters(model)]
    try:
        yield
    finally:
        for p, requires_grad in before:
            p.requires_grad_(requires_grad)


class TokenAdapter(nn.Module):
    """Frozen model + ``N`` learned embeddings + a peft LoRA adapter that is active only while a subclass runs
    them (:meth:`_set_adapter`).

    Attributes:
        model: the base model with the (disabled) adapter injected — a ``PeftModel``, or the plain model for
            an embeddings-only module. With the adapter off it computes exactly the base model, so it serves
            as the model for prefill and decoding.
        embeddings: ``(N, hidden)`` float32 learned embeddings.
        config: :class:`TokenConfig`.
        adapter_name: the peft name of this module's LoRA (other modules' adapters may share ``model``).

    Build with :meth:`create` (training) or :meth:`load` (an exported folder), not with the constructor.

    A subclass names its folder's files in the class attributes ``config_file``, ``embeddings_file`` and
    ``embeddings_key`` (the embeddings' safetensors key), and which linear layers get no LoRA in
    :meth:`excluded_linears`.
    """

    config_file: str
    embeddings_file: str
    embeddings_key: str

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        embeddings: torch.Tensor,
        config: TokenConfig,
        trainable: bool,
        adapter_name: str = DEFAULT_ADAPTER,
    ) -> None:
        super().__init__()
        self.model = model
        device = next(model.parameters()).device
        self.embeddings = nn.Parameter(embeddings.to(device, torch.float32), requires_grad=trainable)
        self.config = config
        self.trainable = trainable
        self.adapter_name = adapter_name
        self._adapter_params = _adapter_parameters(model, adapter_name) if config.uses_lora else []
        self._set_adapter(False)
        self.train(trainable)

    @classmethod
    def create(
        cls: type[Adapter],
        model: PreTrainedModel,
        num_tokens: int = 32,
        lora_rank: int = 8,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        target_modules: list[str] | str = "all-linear",
        init: str = "vocab_mean",
        seed: int = 0,
        adapter_name: str = DEFAULT_ADAPTER,
    ) -> Adapter:
        """A fresh, trainable module on ``model`` (frozen; prepared with ``install_capture``).

        The LoRA is injected into ``model`` in place (peft) and starts as the identity (B = 0). Targets that
        cannot reach what the tokens produce (:meth:`excluded_linears`) get no LoRA.

        ``model`` may already be another module's ``PeftModel``: this module's LoRA is then added
        beside the others as the peft adapter ``adapter_name`` (same initial weights as on a fresh model: the
        same modules draw from the same seeded stream), and the result shares that ``PeftModel``.
        """
        if num_tokens <= 0:
            raise ValueError(f"num_tokens must be positive, got {num_tokens}")
        config = TokenConfig(
            num_tokens=num_tokens,
            hidden_size=model.config.hidden_size,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=target_modules,
            init=init,
            seed=seed,
        )
        shared = isinstance(model, PeftModel)
        base = model.get_base_model() if shared else model
        embeddings = init_embeddings(base, num_tokens, init, seed)
        if not shared:  # a shared PeftModel is frozen already, and its other adapters keep their trainability
            model.requires_grad_(False)
        if config.uses_lora:
            if lora_rank <= 0:
                raise ValueError(
                    f"lora_rank must be positive, got {lora_rank} (use target_modules='none' for no LoRA)"
                )
            torch.manual_seed(seed)  # LoRA A's random init
            lora = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha,
                lora_dropout=lora_dropout,
                # a copy: peft replaces "all-linear" in its config by the names it resolved
                target_modules=copy.copy(target_modules),
                exclude_modules=cls.excluded_linears(
                    base
                ),  # names relative to the base model, as peft matches
                bias="none",
            )
            if shared:
                if adapter_name in model.peft_config:
                    raise ValueError(f"the model already has a LoRA adapter named {adapter_name!r}")
                with _trainability_kept(model):  # the other modules' adapters keep their trainability
                    model.add_adapter(adapter_name, lora)
            else:
                model = get_peft_model(model, lora, adapter_name=adapter_name)
        return cls(model, embeddings, config, trainable=True, adapter_name=adapter_name)

    @classmethod
    def load(
        cls: type[Adapter],
        folder: str | Path,
        model: PreTrainedModel | PeftModel,
        trainable: bool = False,
        adapter_name: str = DEFAULT_ADAPTER,
    ) -> Adapter:
        """Rebuild a module saved by :meth:`save` (an ``lkv export`` folder) on top of ``model``.

        Args:
            model: the base model (prepared with ``install_capture``); its shape must match the saved one. It
                may already carry other modules (their ``PeftModel``): this one's LoRA then joins them
                as the peft adapter ``adapter_name``, so several modules score one prefill (``lkv eval
                --adapters``).
            trainable: keep the embeddings and LoRA weights trainable (to continue training).
            adapter_name: the peft name of this module's LoRA on ``model``.
        """
        folder = Path(folder)
        config = cls.read_folder(folder)
        if config.hidden_size != model.config.hidden_size:
            raise ValueError(
                f"{folder}: the module was trained for hidden size {config.hidden_size}, "
                f"the given model has {model.config.hidden_size}"
            )
        path = folder / cls.embeddings_file
        embeddings = load_file(str(path)).get(cls.embeddings_key)
        if embeddings is None:
            raise ValueError(f"{path}: no tensor named {cls.embeddings_key!r}")
        if tuple(embeddings.shape) != (config.num_tokens, config.hidden_size):
            raise ValueError(
                f"{path}: embeddings have shape {tuple(embeddings.shape)}, "
                f"{cls.config_file} says ({config.num_tokens}, {config.hidden_size})"
            )
        if not isinstance(model, PeftModel):  # a shared PeftModel is frozen already
            model.requires_grad_(False)
        if config.uses_lora:
            if isinstance(model, PeftModel):
                if adapter_name in model.peft_config:
                    raise ValueError(f"the model already has a LoRA adapter named {adapter_name!r}")
                with _trainability_kept(model):
                    model.load_adapter(str(folder), adapter_name=adapter_name, is_trainable=trainable)
            else:
                model = PeftModel.from_pretrained(
                    model, str(folder), adapter_name=adapter_name, is_trainable=trainable
                )
        return cls(model, embeddings, config, trainable=trainable, adapter_name=adapter_name)

    def save(self, folder: str | Path) -> None:
        """Write the standalone adapter folder (peft files + embeddings + its config file).

        Only this module's LoRA is written, under peft's default name whatever its ``adapter_name``, so
        :meth:`load` reads a sibling module's folder like any other.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.config.uses_lora:
            # peft writes a named (non-default) adapter into a subfolder of that name: move its files up
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                self.model.save_pretrained(
                    tmp, selected_adapters=[self.adapter_name], save_embedding_layers=False
                )
                written = Path(tmp) / ("" if self.adapter_name == DEFAULT_ADAPTER else self.adapter_name)
                for path in written.iterdir():
                    if path.is_file():
                        os.replace(path, folder / path.name)
        save_file(
            {self.embeddings_key: self.embeddings.detach().float().cpu().contiguous()},
            str(folder / self.embeddings_file),
        )
        follow_umask(*folder.glob("*.safetensors"))
        (folder / self.config_file).write_text(json.dumps(asdict(self.config), indent=2, sort_keys=True))

    @classmethod
    def read_folder(cls, folder: Path) -> TokenConfig:
        """The config of a folder :meth:`save` wrote, its files checked (:func:`read_token_folder`)."""
        return read_token_folder(folder, cls.config_file, cls.embeddings_file)

    @classmethod
    def excluded_linears(cls, model: PreTrainedModel) -> list[str]:
        """The linear layers of ``model`` that get no LoRA: those that cannot change what the tokens produce
        (:func:`unreachable_linears` of what the subclass reads)."""
        raise NotImplementedError

    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Name → parameter of everything that trains (embeddings + LoRA), names as in ``named_parameters``."""
        adapter = {id(p) for p in self._adapter_params}
        return {n: p for n, p in self.named_parameters() if n == "embeddings" or id(p) in adapter}

    def train(self, mode: bool = True) -> TokenAdapter:
        """Switch the adapter's own dropout; the frozen model always stays in eval mode."""
        self.training = mode
        self.model.eval()
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                dropout = getattr(module, "lora_dropout", None)
                if dropout is not None:
                    dropout.train(mode)
        return self

    def _set_adapter(self, enabled: bool) -> None:
        """Switch this module's LoRA on (made the shared model's active peft adapter) or off; its weights keep
        their trainability (peft would flip it)."""
        if not self.config.uses_lora:
            return
        with _trainability_kept(self.model):
            if enabled:
                # the active adapter is per model: another module's step may have made its own adapter active
                self.model.set_adapter(self.adapter_name)
                self.model.base_model.enable_adapter_layers()
            else:
                self.model.base_model.disable_adapter_layers()
        for p in self._adapter_params:
            p.requires_grad_(self.trainable)

    @property
    def base_model(self) -> PreTrainedModel:
        """The model the adapter is injected into (the one that prefills and decodes)."""
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
