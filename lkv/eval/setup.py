"""What every benchmark kind of ``lkv eval`` runs on: the model, one :class:`Compressor` per method, the budgets
and settings, and the results file (:class:`EvalSetup`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.budget import Budget
from lkv.core.clock import clock
from lkv.core.context import Truncate, model_context
from lkv.eval.prefill import Prefilled
from lkv.eval.prompt_settings import SETTINGS, Setting
from lkv.eval.results import RESULTS_FILE, ResultsFile
from lkv.eval.screen import SolvedScreen
from lkv.eval.shard import WHOLE, Shard
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import FullKVPress, Press, PressContext
from lkv.eviction.records import Generation
from lkv.eviction.roles import REFERENCE, roles_of
from lkv.eviction.selector import DEFAULT_SELECTION, Selection


class EvalSetup:
    """A set of eviction methods on one model, the rows they are to make and the file the rows go to.

    Args:
        model: the model every method compresses (for LookaheadKV: the base model its adapter is injected in).
        tokenizer: its tokenizer.
        presses: method name → press. ``fullkv`` and ``oracle`` need no real press (any instance will do:
            FullKV keeps everything, the Oracle's scores come from the FullKV answer).
        budgets: tokens kept per KV head (ints) or ratios of the prompt (floats), checked here
            (:class:`~lkv.core.budget.Budget`).
        settings: ``aware`` and/or ``agnostic``.
        output: result folder.
        progress: show progress bars.
        streamed: methods that can (:attr:`Press.streamable`) compress each (prompt, budget) with layer-streamed
            eviction (:mod:`lkv.eviction.streamed`: a prefill of their own per budget, one layer's full K/V at a
            time, the same answers); the others score the shared prefill.
        batch_size: answers decoded together (:mod:`lkv.eval.batched_decode`), and the most (sample, setting)
            pairs per chunk (their full caches are held together, stacked). 1 decodes one answer at a time.
        max_batch_tokens: the most cached tokens of a chunk's stacked full caches (pairs × the longest one's
            entries); a chunk holds fewer pairs where prompts are long. None: derived from the device's free
            memory (:func:`lkv.eval.units.device_batch_tokens`; no limit on a CPU). The peak is in docs/scale_out.md.
        enable_thinking: the chat template's variable the samples are rendered with
            (:func:`lkv.eval.tasks.encode_sample`; off, as labels are rendered).
        selection: every method's selector settings (:class:`~lkv.eviction.selector.Selection`), e.g. how its
            budget is spread over the KV heads of a layer: ``equal``, ``adaptive`` (AdaKV) or ``threshold``
            (KVzap's DMS: per task, method and budget one threshold calibrated on every prompt the task
            compresses, both settings, so the mean kept entries per (layer, KV head) is the budget;
            :meth:`Compressor.calibrate`, an extra prefill per prompt and method; the Oracle, scored from the
            FullKV answer, is matched per prompt instead). Its rows add ``threshold`` and ``kept_std``.
        truncate: a sample whose context, question and answer tokens do not fit in the model's context
            (:func:`lkv.core.context.fit_context`): ``error`` refuses it before the task's first prefill;
            ``left`` or ``middle`` cut its context.
        shard: the share of each task's samples this process runs (:class:`~lkv.eval.shard.Shard`; default
            all); other processes may run the other shares into the same folder.
        screen: run only the (sample, setting) pairs an earlier run's FullKV solved
            (:class:`~lkv.eval.screen.SolvedScreen`; end tasks), before sharding; None runs every one.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        presses: dict[str, Press],
        budgets: Iterable[Budget | int | float],
        settings: Iterable[Setting] = SETTINGS,
        output: str | Path = "reports/eval",
        progress: bool = True,
        streamed: bool = False,
        batch_size: int = 8,
        enable_thinking: bool = False,
        max_batch_tokens: int | None = None,
        selection: Selection = DEFAULT_SELECTION,
        truncate: Truncate = "error",
        shard: Shard = WHOLE,
        screen: SolvedScreen | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if max_batch_tokens is not None and max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.budgets = [Budget.of(budget) for budget in budgets]
        self.settings = list(settings)
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or not self.settings:
            raise ValueError(f"settings must be a non-empty subset of {SETTINGS}, got {self.settings}")
        if not self.budgets:
            raise ValueError("give at least one budget")
        self.methods = list(presses)
        self.compressors = {
            name: Compressor(model, tokenizer, press, selection=selection) for name, press in presses.items()
        }
        self.full = self.compressors.get(REFERENCE) or Compressor(model, tokenizer, FullKVPress())
        self.output = Path(output)
        self.results = ResultsFile(self.output / RESULTS_FILE)
        self.progress = progress
        self.streamed = streamed
        self.batch_size = batch_size
        self.enable_thinking = enable_thinking
        self.max_batch_tokens = max_batch_tokens
        self.truncate = truncate
        self.shard = shard
        self.screen = screen
        self.selection = selection
        self.context = model_context(model)
        self.token_cap: int | None = None  # derived from the free device memory when max_batch_tokens is None

    def press_scores(self, method: str, shared: Prefilled) -> tuple[torch.Tensor, float]:
        """``method``'s ``(1, layers, kv_heads, S)`` scores of a shared prefill, and the seconds they took.

        Methods whose presses share a :meth:`~lkv.eviction.presses.Press.score_key` are scored once per prefill
        (``shared.memo``); each reports that scoring's seconds, what it costs a method run alone."""
        press = self.compressors[method].press
        key = press.score_key()
        if key is not None and key in shared.memo:
            return shared.memo[key]
        ctx = PressContext(
            self.model,
            shared.ids,
            shared.cache,
            shared.next_logits,
            shared.captures[method],
            self.full.eos_token_ids,
            self.tokenizer,
        )
        start = clock(shared.ids.device)
        scores = press.score(ctx)
        scored = scores, clock(shared.ids.device) - start
        if key is not None:
            shared.memo[key] = scored
        return scored

    def calibrate(self, prompts: list[list[int]]) -> None:
        """Under ``threshold`` selection, each scored method's threshold per budget over ``prompts`` (a task's)."""
        for method, compressor in self.compressors.items():
            if roles_of(method).role == "method":
                compressor.thresholds = compressor.calibrate(prompts, self.budgets)

    def threshold_fields(self, method: str, budget: Budget | None, gen: Generation) -> dict[str, Any]:
        """Under ``threshold`` selection, a row's threshold (``None``: matched on its prompt) and ``kept_std``."""
        if self.selection.head_budget != "threshold" or budget is None:
            return {}
        return {"threshold": self.compressors[method].thresholds.get(budget), "kept_std": gen.kept_std}
