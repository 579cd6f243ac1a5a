"""The lookahead module: ``M`` learned embeddings + a LoRA adapter that is active only while they run.

After a prompt's prefill (adapter off, so the cache is exactly the base model's), :meth:`LookaheadAdapter.predict`
appends the ``M`` embeddings at positions ``S..S+M-1`` with the adapter on, reads their attention on the
prompt keys through an :class:`~lkv.core.attention.ImportanceCapture`, then crops their K/V away and switches the
adapter off again. :meth:`LookaheadAdapter.stream` computes the same, one layer at a time beside the prompt's
prefill (layer-streamed eviction, :mod:`lkv.eviction.streamed`). Only the embeddings and the LoRA weights train; the LLM is frozen (docs/design.md §1).

Several lookahead modules can share one frozen model (an in-run ablation, :mod:`lkv.sweep.ablation`): each one's
LoRA is a named peft adapter (``adapter_name``) on the same model, and each switches its own adapter on for its
own lookahead step only.

An exported folder (:meth:`LookaheadAdapter.save`) holds::

    lookahead.json                    settings + the base model's signature
    lookahead_embeddings.safetensors  {"embeddings": (M, hidden)} float32
    adapter_config.json, adapter_model.safetensors   peft LoRA files (absent for embeddings-only modules)
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from lkv import __version__
from lkv.core.attention import ImportanceCapture
from lkv.core.compat import cache_kwargs, layer_causal_mask
from lkv.core.files import check_safetensors, follow_umask
from lkv.core.generation import crop_to

CONFIG_FILE = "lookahead.json"
EMBEDDINGS_FILE = "lookahead_embeddings.safetensors"
# peft's name of a model's first adapter; an exported folder always holds its LoRA under this name.
DEFAULT_ADAPTER = "default"
INITS = ("vocab_mean", "random_tokens", "normal")
#: ``extra`` key of the prompt setting a module was trained for (its labels' setting; written by `lkv export`)
SETTING_KEY = "setting"
#: the settings a module may be trained for: ``aware`` (its lookahead tokens saw the question after the
#: context) or ``agnostic`` (they saw the context alone)
TRAINED_SETTINGS = ("aware", "agnostic")
NO_LORA = "none"


@dataclass
class LookaheadConfig:
    """Settings of a lookahead module, stored as ``lookahead.json`` beside its weights.

    Attributes:
        num_tokens: ``M``, the number of lookahead embeddings.
        hidden_size: width of each embedding (the base model's hidden size).
        lora_rank, lora_alpha, lora_dropout: LoRA settings (ignored when ``target_modules`` is ``"none"``).
        target_modules: ``"all-linear"`` (q,k,v,o,gate,up,down; never lm_head), a list of module names,
            or ``"none"`` for an embeddings-only module. The last layer keeps only q and k of them
            (:func:`unreachable_linears`).
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


def exported_base_model(folder: str | Path) -> str | None:
    """The base model an ``lkv export`` folder was exported from (``extra["model"]``), if it says."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("extra", {}).get("model")
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed lookahead config ({err})") from err


def trained_setting(extra: Mapping[str, Any], where: str) -> str:
    """The prompt setting a module was trained for, from its config's ``extra``: ``extra["setting"]``, and
    ``aware`` for a folder exported before modules recorded it (every module then was trained aware).

    Raises:
        ValueError: a value that is not a setting, naming ``where`` (the file).
    """
    setting = extra.get(SETTING_KEY, "aware")
    if setting not in TRAINED_SETTINGS:
        raise ValueError(
            f"{where}: extra.{SETTING_KEY}: expected one of {TRAINED_SETTINGS}, found {setting!r}"
        )
    return setting


def read_lookahead_folder(
    folder: Path, config_file: str = CONFIG_FILE, embeddings_file: str = EMBEDDINGS_FILE
) -> LookaheadConfig:
    """The config of an ``lkv export`` adapter folder, after checking that its weight files are there and
    whole (the embeddings, and the peft LoRA files when the module has LoRA), before any model loads.

    Args:
        config_file, embeddings_file: the folder's file names (a restore module's differ:
            :class:`lkv.model.restore.RestoreAdapter`).

    Raises:
        FileNotFoundError: a missing file, named.
        ValueError: a malformed config or an unreadable safetensors file, named.
    """
    path = folder / config_file
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found — is {folder} a folder written by `lkv export`?")
    try:
        config = LookaheadConfig(**json.loads(path.read_text()))
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
    """Initial lookahead embeddings ``(M, hidden)`` float32, on the device of the model's input embedding table.

    ``vocab_mean``: every row is the mean token embedding (rows still differ through their positions);
    ``random_tokens``: embeddings of ``M`` seeded random vocabulary tokens;
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
    raise ValueError(f"lookahead init must be one of {INITS}, got {init!r}")


def unreachable_linears(model: PreTrainedModel, read: tuple[str, ...] = ("q_proj", "k_proj")) -> list[str]:
    """Names of the linear layers whose LoRA could never change the predicted scores: in the last decoder layer,
    everything but the projections ``read`` (default: the query and key projections).

    The lookahead step reads the last layer's attention *rows*, which depend on its queries and keys only;
    its values, output projection and MLP feed nothing after them (no LM head runs). Their LoRA weights would
    never get a gradient, and DDP would have to search the graph for unused parameters every step. (A restore
    module reads the last layer's keys and values instead: :class:`lkv.model.restore.RestoreAdapter`.)
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


class LookaheadAdapter(nn.Module):
    """Frozen model + ``M`` lookahead embeddings + a peft LoRA adapter that is active ONLY inside :meth:`predict`.

    Attributes:
        model: the base model with the (disabled) adapter injected — a ``PeftModel``, or the plain model for
            an embeddings-only module. Outside :meth:`predict` it computes exactly the base model, so it
            serves as the model for prefill and decoding.
        embeddings: ``(M, hidden)`` float32 lookahead embeddings.
        config: :class:`LookaheadConfig`.
        adapter_name: the peft name of this module's LoRA (other modules' adapters may share ``model``).

    Build with :meth:`create` (training) or :meth:`load` (an exported folder), not with the constructor.

    The class attributes name its folder's files (:data:`CONFIG_FILE`, :data:`EMBEDDINGS_FILE` and the
    embeddings' safetensors key) and which linear layers get no LoRA (:meth:`excluded_linears`): a subclass with
    other learned tokens (:class:`lkv.model.restore.RestoreAdapter`) changes them.
    """

    config_file = CONFIG_FILE
    embeddings_file = EMBEDDINGS_FILE
    embeddings_key = "embeddings"

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        embeddings: torch.Tensor,
        config: LookaheadConfig,
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
        cls,
        model: PreTrainedModel,
        num_tokens: int = 32,
        lora_rank: int = 8,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        target_modules: list[str] | str = "all-linear",
        init: str = "vocab_mean",
        seed: int = 0,
        adapter_name: str = DEFAULT_ADAPTER,
    ) -> LookaheadAdapter:
        """A fresh, trainable lookahead module on ``model`` (frozen; prepared with ``install_capture``).

        The LoRA is injected into ``model`` in place (peft) and starts as the identity (B = 0). Targets that
        cannot reach the loss (:func:`unreachable_linears`: the last layer's v, o and MLP) get no LoRA.

        ``model`` may already be another lookahead module's ``PeftModel``: this module's LoRA is then added
        beside the others as the peft adapter ``adapter_name`` (same initial weights as on a fresh model: the
        same modules draw from the same seeded stream), and the result shares that ``PeftModel``.
        """
        if num_tokens <= 0:
            raise ValueError(f"num_tokens must be positive, got {num_tokens}")
        config = LookaheadConfig(
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
        cls,
        folder: str | Path,
        model: PreTrainedModel | PeftModel,
        trainable: bool = False,
        adapter_name: str = DEFAULT_ADAPTER,
    ) -> LookaheadAdapter:
        """Rebuild a module saved by :meth:`save` (an ``lkv export`` folder) on top of ``model``.

        Args:
            model: the base model (prepared with ``install_capture``); its shape must match the saved one. It
                may already carry other lookahead modules (their ``PeftModel``): this one's LoRA then joins them
                as the peft adapter ``adapter_name``, so several modules score one prefill (``lkv eval
                --adapters``).
            trainable: keep the embeddings and LoRA weights trainable (to continue training).
            adapter_name: the peft name of this module's LoRA on ``model``.
        """
        folder = Path(folder)
        config = cls.read_folder(folder)
        if config.hidden_size != model.config.hidden_size:
            raise ValueError(
                f"{folder}: lookahead module was trained for hidden size {config.hidden_size}, "
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
        """Write the standalone adapter folder (peft files + embeddings + ``lookahead.json``).

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
    def read_folder(cls, folder: Path) -> LookaheadConfig:
        """The config of a folder :meth:`save` wrote, its files checked (:func:`read_lookahead_folder`)."""
        return read_lookahead_folder(folder, cls.config_file, cls.embeddings_file)

    @classmethod
    def excluded_linears(cls, model: PreTrainedModel) -> list[str]:
        """The linear layers of ``model`` that get no LoRA: those that cannot change the predicted scores
        (:func:`unreachable_linears`)."""
        return unreachable_linears(model)

    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """Name → parameter of everything that trains (embeddings + LoRA), names as in ``named_parameters``."""
        adapter = {id(p) for p in self._adapter_params}
        return {n: p for n, p in self.named_parameters() if n == "embeddings" or id(p) in adapter}

    def train(self, mode: bool = True) -> LookaheadAdapter:
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

    def predict(self, cache: DynamicCache, prompt_len: int, position_offset: int = 0) -> torch.Tensor:
        """Predicted importance of every prompt position.

        Runs the ``M`` embeddings at positions ``S..S+M-1`` on top of the prompt cache with the adapter on
        and reduces their attention on the prompt keys. The cache is cropped back to ``prompt_len`` and the
        adapter switched off even on error. Differentiable when grad is enabled (no LM head is applied).

        Args:
            cache: the prompt's cache from a prefill with the adapter off, exactly ``prompt_len`` entries.
            position_offset: extra positions between the prompt and the lookahead tokens, which then sit at
                ``S+o..S+o+M-1`` (RoPE sees every query–key distance ``o`` tokens longer; the keys, the mask and
                the cache are unchanged). Training draws it at random so that short prompts teach the distances
                of long ones (:class:`lkv.train.module.LookaheadKVModule`, ``max_position_offset``); inference
                uses 0.

        Returns:
            ``(1, layers, kv_heads, S)`` float32; every ``[0, l, h]`` row sums to 1.
        """
        if cache.get_seq_length() != prompt_len:
            raise ValueError(
                f"cache holds {cache.get_seq_length()} tokens, expected the prompt's {prompt_len}"
            )
        base = self.base_model
        decoder = base.get_decoder()
        embeds, positions, capture = self._inputs(prompt_len, position_offset)
        self._set_adapter(True)
        try:
            decoder(
                inputs_embeds=embeds,
                position_ids=positions,
                **cache_kwargs(cache),
                use_cache=True,
                lkv_capture=capture,
            )
        finally:
            crop_to(cache, prompt_len)
            # With grad, the cropped K/V are views of [prompt; lookahead] tensors inside this step's graph: a
            # second lookahead step on the same cache (another module's) would backpropagate into this one.
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.detach(), layer.values.detach()
            self._set_adapter(False)
        return capture.scores(base.config.num_hidden_layers)

    def stream(self, cache: DynamicCache, prompt_len: int) -> LookaheadStream:
        """The lookahead tokens' residual stream beside a layer-by-layer prefill of the prompt into ``cache``."""
        return LookaheadStream(self, cache, prompt_len)

    @property
    def base_model(self) -> PreTrainedModel:
        """The model the adapter is injected into (the one that prefills and decodes)."""
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    def _inputs(
        self, prompt_len: int, position_offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, ImportanceCapture]:
        """``(embeds (1, M, hidden), positions (1, M), capture)`` of a lookahead step after ``prompt_len`` tokens,
        ``position_offset`` positions further on (see :meth:`predict`)."""
        if position_offset < 0:
            raise ValueError(f"position_offset must be ≥ 0, got {position_offset}")
        embeds = self.embeddings.to(self.base_model.get_input_embeddings().weight.dtype)[None]
        first = prompt_len + position_offset
        positions = torch.arange(first, first + self.config.num_tokens, device=embeds.device)[None]
        # the capture computes the M queries' attention output too: the layer's kernel would repeat its logits
        return embeds, positions, ImportanceCapture(num_keys=prompt_len, computes_output=True)


class LookaheadStream:
    """The ``M`` lookahead tokens run layer by layer beside a prompt's prefill (docs/design.md §1, Eviction).

    The adapter touches only the lookahead tokens and they come last, so at layer ``l`` they need only layer
    ``l``'s prompt K/V and their own hidden state from layer ``l − 1``: :meth:`layer_scores` runs them through
    layer ``l`` as soon as the prompt has passed it, and returns the same scores as :meth:`LookaheadAdapter.predict`
    after a full prefill — while earlier layers may already be evicted and later ones are still empty.

    Args:
        adapter: the lookahead module; cache: the cache the prompt is being prefilled into (adapter off);
        prompt_len: ``S``.
    """

    def __init__(self, adapter: LookaheadAdapter, cache: DynamicCache, prompt_len: int) -> None:
        base = adapter.base_model
        self.decoder = base.get_decoder()
        if not hasattr(self.decoder, "rotary_emb"):
            raise NotImplementedError(
                f"{type(self.decoder).__name__} has no shared rotary embedding: cannot stream the lookahead tokens"
            )
        types = set(getattr(base.config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise NotImplementedError(
                f"layer-streamed lookahead needs full-attention layers only, got {types}"
            )
        self.adapter = adapter
        self.cache = cache
        self.prompt_len = prompt_len
        # (1, M, hidden): the lookahead tokens' residual stream, the output of the last layer run
        self.hidden, self.positions, self.capture = adapter._inputs(prompt_len)
        self.position_embeddings = self.decoder.rotary_emb(self.hidden, position_ids=self.positions)

    def layer_scores(self, layer_idx: int) -> torch.Tensor:
        """Run the lookahead tokens through layer ``layer_idx`` (adapter on) and return their importance.

        Layer ``layer_idx`` of the cache must hold exactly the prompt's ``S`` entries; their K/V are cropped away
        again (and the adapter switched off) even on error.

        Returns:
            ``(1, kv_heads, S)`` float32, summing to 1 over ``S``.
        """
        layer_cache = self.cache.layers[layer_idx]
        if layer_cache.get_seq_length() != self.prompt_len:
            raise ValueError(
                f"layer {layer_idx} of the cache holds {layer_cache.get_seq_length()} entries, expected the "
                f"prompt's {self.prompt_len}"
            )
        # the mask predict's decoder builds, sized from this layer (earlier layers may already be evicted)
        mask = layer_causal_mask(self.decoder.config, self.hidden, self.cache, self.positions, layer_idx)
        self.adapter._set_adapter(True)
        try:
            self.hidden = self.decoder.layers[layer_idx](
                self.hidden,
                attention_mask=mask,
                position_ids=self.positions,
                **cache_kwargs(self.cache),
                use_cache=True,
                position_embeddings=self.position_embeddings,
                lkv_capture=self.capture,
            )
        finally:
            layer_cache.crop(self.prompt_len - layer_cache.get_seq_length())
            self.adapter._set_adapter(False)
        return self.capture.take(layer_idx)
