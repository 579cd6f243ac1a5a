"""Builders shared by the eviction tests: one press per registered method, with small settings."""

import torch

from lkv.eviction.presses import FusedPress, Press
from lkv.eviction.presses.lookaheadkv import LookaheadKVPress
from lkv.eviction.presses.probe import ProbePress
from lkv.eviction.presses.sentences import SentencePress
from lkv.eviction.registry import make_method
from lkv.model.lookahead import LookaheadAdapter
from lkv.model.probe import ImportanceProbe

# Settings that fit a 48-token prompt and a 12-token budget.
SETTINGS = {
    "fullkv": {},
    "streamingllm": {"sink": 2},
    "snapkv": {"window": 4},
    "pyramidkv": {"window": 4},
    "h2o": {"recent": 4},
    "tova": {},
    "random": {"seed": 1},
    "laq": {"draft_budget": 12, "num_tokens": 4, "window": 4, "kernel": 3},
    "speckv": {"draft_layers": 1, "num_tokens": 4, "window": 4, "kernel": 3},
    "oracle": {"response_tokens": 6},
    "lookaheadkv": {},
    "expected_attention": {"n_future_positions": 64},
    "kvzip": {"chunk_size": 20},
    "keydiff": {},
    "probe": {},
}
# A LookaheadKV press that max-pools its scores (not a registered method: a setting of lookaheadkv).
POOLED = "lookaheadkv-pooled"
# LookaheadKV fused with the probe, max-pooled (a setting of a lookahead module in `lkv eval`: probe_weight).
FUSED = "lookaheadkv+probe"
# The fusion by the union rule with half of the budget to whole sentences, except in the prompt's last
# SENTENCES_BEYOND tokens (`lkv eval`'s press_args: sentences, sentences_beyond).
SENTENCES = "lookaheadkv+probe+sentences"
# The same with the share scaled by the part of the prompt before those tokens (sentences_scaled).
SCALED = "lookaheadkv+probe+sentences-scaled"


PROMPT_LEN = 48
SENTENCES_BEYOND = PROMPT_LEN // 3


def build_press(name: str, model) -> Press:
    if name == "probe":  # an untrained MLP probe: random weights rank the tokens as well as trained ones
        return ProbePress(ImportanceProbe.create(model, hidden_dim=8, seed=0))
    if not name.startswith("lookaheadkv"):
        return make_method(name, **SETTINGS[name])
    adapter = LookaheadAdapter.create(model, num_tokens=4, lora_rank=2, seed=0)
    # A non-zero LoRA (B starts at 0), so an adapter leaking outside predict() would change the answers.
    generator = torch.Generator().manual_seed(0)
    for param_name, param in adapter.trainable_parameters().items():
        if "lora_B" in param_name:
            param.data.copy_(0.5 * torch.randn(param.shape, generator=generator))
    if name in (SENTENCES, SCALED):
        union = FusedPress(
            [LookaheadKVPress(adapter, kernel=5), build_press("probe", model)], [0.5, 0.5], rule="union"
        )
        ends = sentence_ends_every(model.config.vocab_size, 5)
        return SentencePress(union, ends, 0.5, SENTENCES_BEYOND, scaled=name == SCALED)
    if name == FUSED:
        return FusedPress([LookaheadKVPress(adapter, kernel=1), build_press("probe", model)], [0.5, 0.5], 5)
    return LookaheadKVPress(adapter, kernel=5 if name == POOLED else 1)


def sentence_ends_every(vocab_size: int, period: int) -> torch.Tensor:
    """``(vocab_size,)`` bool: every ``period``-th token id ends a sentence (random prompts get sentences of a
    few tokens)."""
    return torch.arange(vocab_size) % period == 0


def prompt(model, length: int = PROMPT_LEN, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)
    )
