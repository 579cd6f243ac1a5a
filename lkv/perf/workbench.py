"""The settings of ``lkv bench`` and the workbench its suites build their cases on.

:class:`BenchSettings` is plain JSON values, so a CPU memory subprocess rebuilds the same case from it;
:class:`Workbench` holds what the cases of one process share (the model, a lookahead module, the prompts),
each built on first use.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lkv.eviction.presses import LookaheadKVPress, Press, ProbePress
from lkv.eviction.registry import make_method
from lkv.model.probe import ImportanceProbe
from lkv.perf.models import load_model


@dataclass
class BenchSettings:
    """What the cases are built from (shared with the memory subprocesses, hence plain JSON values).

    See :func:`bench` for the meaning of each field.
    """

    model: str = "smollm2-135m"
    dtype: str = "float32"
    device: str | None = None
    attn_implementation: str = "sdpa"
    methods: list[str] = field(default_factory=lambda: ["snapkv", "lookaheadkv", "laq", "speckv"])
    budget: int = 256
    window: int = 32
    num_lookahead: int = 32
    lora_rank: int = 8
    probe_hidden: int = 512
    draft_tokens: int = 8
    draft_layers: int | None = None
    response_tokens: int = 64
    decode_tokens: int = 32
    eager_max_length: int = 2048
    stream_method: str = "lookaheadkv"
    num_layers: int | None = None
    batch_sizes: list[int] | None = None
    label_prompts: int | None = None
    label_length_spread: float = 0.25
    seed: int = 0


class Workbench:
    """The models and inputs the cases of one process share, each built on first use."""

    def __init__(
        self, settings: BenchSettings, model: PreTrainedModel | None = None, share_model: bool = False
    ) -> None:
        """``model``: use it instead of loading ``settings.model`` (e.g. a depth-cut architecture);
        ``share_model``: inject the lookahead module into the model itself, not a copy (when only the
        training step runs: a copy of an 8B-wide model costs gigabytes)."""
        self.settings = settings
        self.share_model = share_model
        #: what a suite builds once and its variants share, by (suite, length) (e.g. compressed answers)
        self.shared: dict[tuple[str, int], Any] = {}
        if model is not None:
            self.__dict__["model"] = model

    @cached_property
    def model(self) -> PreTrainedModel:
        s = self.settings
        return load_model(s.model, s.dtype, s.device, s.attn_implementation, s.num_layers)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The model's tokenizer, for presses that write text of their own (KVzip's repeat prompt); a random
        model (no folder) has none."""
        path = self.model.config.name_or_path
        return AutoTokenizer.from_pretrained(path) if path else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @cached_property
    def lookahead(self):
        """A randomly initialised lookahead module on a *copy* of the model (unless ``share_model``).

        The LoRA is injected in place, so the plain prefill and the other methods keep running the
        unwrapped model, while LookaheadKV pays for peft's (disabled) wrappers in its own prefill.
        """
        from lkv.model.lookahead import LookaheadAdapter

        s = self.settings
        return LookaheadAdapter.create(
            self.model if self.share_model else copy.deepcopy(self.model),
            num_tokens=s.num_lookahead,
            lora_rank=s.lora_rank,
            seed=s.seed,
        )

    @cached_property
    def training_module(self):
        """``LookaheadKVModule`` around :attr:`lookahead`, so the benchmark runs its real ``training_step``."""
        from lkv.train.module import LookaheadKVModule

        s = self.settings
        module = LookaheadKVModule(
            model=s.model, dtype=s.dtype, num_lookahead=s.num_lookahead, lora_rank=s.lora_rank, seed=s.seed
        )
        module.adapter = self.lookahead  # configure_model() then keeps it instead of loading a backbone
        return module

    def prompt(self, length: int) -> torch.Tensor:
        """``(1, length)`` seeded random token ids."""
        generator = torch.Generator().manual_seed(self.settings.seed + length)
        ids = torch.randint(0, self.model.config.vocab_size, (1, length), generator=generator)
        return ids.to(self.device)

    def target(self, length: int) -> torch.Tensor:
        """``(layers, kv_heads, length)`` random label distributions."""
        config = self.model.config
        generator = torch.Generator().manual_seed(self.settings.seed)
        logits = torch.randn(
            config.num_hidden_layers, config.num_key_value_heads, length, generator=generator
        )
        return torch.softmax(logits, dim=-1).to(self.device)

    def press(self, method: str) -> Press:
        s = self.settings
        if method == "lookaheadkv":
            return LookaheadKVPress(self.lookahead)
        if method == "probe":  # random weights, as the lookahead module's: timing does not depend on them
            probe = ImportanceProbe.create(self.model, hidden_dim=s.probe_hidden, seed=s.seed)
            return ProbePress(probe.to(self.device).eval().requires_grad_(False))
        if method == "laq":  # its SnapKV-compressed draft cache keeps the eviction budget, as in the paper
            return make_method(method, draft_budget=s.budget, num_tokens=s.draft_tokens, window=s.window)
        if method == "speckv":
            return make_method(
                method, draft_layers=s.draft_layers, num_tokens=s.draft_tokens, window=s.window
            )
        if method in ("snapkv", "pyramidkv"):
            return make_method(method, window=s.window)
        return make_method(method)
