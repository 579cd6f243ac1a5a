"""Compress a prompt's KV cache with any eviction method and generate from it (Python API + `lkv generate`).

    from lkv.model.backbone import load_backbone
    from lkv.eviction.compressor import Compressor

    model, tokenizer = load_backbone("smollm2-135m")
    gen = Compressor(model, tokenizer, press="snapkv", budget=128)      # 128 tokens per KV head (or 0.25)
    out = gen.generate("Summarise: ...", Sampling(max_new_tokens=64))             # question-aware (paper)
    print(out.text, out.kv_bytes_kept / out.kv_bytes_full)

    context = gen.compress_context(long_document)                      # question-agnostic: compress once,
    for question in questions:                                         # answer many (each on its own copy)
        print(gen.answer(context, question).text)

    scored = gen.score(prompt)                                         # budget sweeps: one prefill + scoring,
    for budget in (64, 128, 256):                                      # then one cheap eviction per budget
        print(budget, gen.decode(gen.evict(scored, budget)).text)

    from lkv.eviction.presses.lookaheadkv import load_lookahead          # a trained LookaheadKV folder with a
    model, tokenizer, press = load_lookahead("runs/adapter", settings="long")   # preset (lookahead_settings)
    Compressor(model, tokenizer, press, budget=256).generate(long_prompt)

    from lkv.eviction.decoding import H2ODecode                                 # decode-time methods: the cache stays
    Compressor(model, tokenizer, "h2o-decode", budget=128)             # within 128 entries while generating
    Compressor(model, tokenizer, "snapkv", budget=128, decode_policy=H2ODecode())

The flow of one prompt (docs/design.md §1): prefill (with the press's capture, if any) → ``press.score`` →
:func:`~lkv.eviction.selector.select_indices` → :func:`~lkv.core.cache.gather_cache` (the K/V tensors shrink
to the budget) → decode with position ids continuing from the uncompressed prompt length. With a decode-time
policy (:mod:`lkv.eviction.decoding`) the cache keeps being looked after while the answer is generated.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from lkv.core.budget import Budget
from lkv.core.cache import AppendedKV, append_entries, cache_bytes, gather_cache
from lkv.core.chat import encode_context, encode_question, render_chat
from lkv.core.clock import clock
from lkv.core.generation import (
    GREEDY,
    CacheUpkeep,
    Sampling,
    StopStrings,
    answer_text,
    append_tokens,
    decode,
    eos_ids,
    prefill,
)
from lkv.eviction.decoding import CacheTrace, DecodePolicy, DecodeStart, DecodeTimePress
from lkv.eviction.presses import Press, PressContext
from lkv.eviction.records import CompressedPrompt, Generation, ScoredPrompt, answer_record
from lkv.eviction.registry import make_method
from lkv.eviction.selector import DEFAULT_SELECTION, Selection, select_indices
from lkv.eviction.streamed import streamed_compress
from lkv.eviction.threshold import calibrate_threshold

Prompt = str | list[dict[str, str]] | Sequence[int] | torch.Tensor


class Compressor:
    """Prefill → score → keep the top-``C`` prompt tokens per (layer, KV head) → decode.

    Args:
        model: a causal LM prepared with :func:`lkv.core.attention.install_capture` (as ``load_backbone`` returns).
        tokenizer: needed for text prompts and decoded answers; ``None`` works with token ids.
        press: an eviction method, or its name in :data:`lkv.eviction.registry.METHODS`.
        budget: tokens kept per KV head (``int``, paper) or a ratio of the prompt in ``(0, 1]`` (``float``), or
            a checked :class:`~lkv.core.budget.Budget`.
        selection: the selector's settings (:class:`~lkv.eviction.selector.Selection`): leading / trailing
            prompt tokens always kept on top of the method's own, optional 1-D pooling of the scores, and how a
            layer's budget is spread over its KV heads: ``equal`` (every head keeps ``C``, the paper's) or
            ``adaptive`` (AdaKV: each layer keeps ``C · kv_heads`` entries, spread over its heads by score). A
            layer is then gathered to its widest head's count and the other heads' padding slots are masked
            (:mod:`lkv.core.cache`); ``kept_per_layer`` counts real entries, ``kv_bytes_kept`` what is allocated.
            ``threshold`` (KVzap's DMS) keeps every entry whose normalised score passes the selection's
            threshold, so heads, layers and prompts keep different counts (gathered as under ``adaptive``, each
            layer to its own width); the budget only decides whether to evict at all (a prompt it holds whole,
            and FullKV, are not evicted). With no threshold of the selection's or of
            ``thresholds``, each prompt is matched to the budget on its own: the threshold that keeps ``C``
            entries per (layer, KV head) on average over its layers and heads
            (:func:`~lkv.eviction.threshold.calibrate_threshold`; then no layer-streamed eviction).
        decode_policy: keeps acting while the answer is generated (e.g. :class:`lkv.eviction.decoding.H2ODecode`:
            the cache never outgrows the budget); a decode-time method (``h2o-decode``, ...) brings its own.
        streamed: :meth:`compress` scores and evicts each layer as soon as the prompt has passed it
            (:mod:`lkv.eviction.streamed`: only one layer's full K/V at a time, same result). Presses that need
            the whole prompt first (Oracle, LAQ, SpecKV, KVzip, decode-time methods) keep the two-phase path;
            :meth:`score` / :meth:`evict` (one prefill, many budgets) are always two-phase.
        enable_thinking: the chat template's variable for text prompts, contexts and questions
            (:func:`lkv.core.chat.template_kwargs`; off: Qwen3 answers without reasoning first).
        thresholds: under ``head_budget="threshold"``, the threshold for each target budget (one calibrated on a
            suite's prompts: :meth:`calibrate`), used instead of the selection's when evicting to that budget.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        press: Press | str = "snapkv",
        budget: Budget | int | float = 128,
        selection: Selection = DEFAULT_SELECTION,
        decode_policy: DecodePolicy | None = None,
        streamed: bool = False,
        enable_thinking: bool = False,
        thresholds: Mapping[Budget, float] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.press = make_method(press) if isinstance(press, str) else press
        if isinstance(self.press, DecodeTimePress):
            if decode_policy is not None:
                raise ValueError(
                    f"{self.press.name} brings its own decode policy; pass its prefill press to combine it with "
                    f"decode_policy={decode_policy.name}"
                )
            decode_policy = self.press.decode_policy
        self.decode_policy = decode_policy
        if selection.head_budget != "equal" and decode_policy is not None:
            raise ValueError(
                f"head_budget={selection.head_budget!r} cannot go with the decode-time policy "
                f"{decode_policy.name}, which keeps the same number of entries in every head while it decodes"
            )
        self.selection = selection
        self.budget = Budget.of(budget)
        self.streamed = streamed
        self.enable_thinking = enable_thinking
        self.thresholds = dict(thresholds or {})
        self.eos_token_ids = eos_ids(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, prompt: Prompt) -> torch.Tensor:
        """``(1, S)`` tokens: text becomes one user message (chat template if any), messages are rendered."""
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)):
            if self.tokenizer is None:
                raise ValueError(
                    "text prompts need a tokenizer; pass token ids or give Compressor a tokenizer"
                )
            if isinstance(prompt, str) and not prompt.strip():
                raise ValueError("the prompt is empty: there is nothing to prefill or compress")
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            if getattr(self.tokenizer, "chat_template", None):
                text = render_chat(self.tokenizer, messages, self.enable_thinking)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            else:
                ids = self.tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]
        else:
            ids = prompt
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ValueError(f"a prompt must be one sequence of token ids, got shape {tuple(ids.shape)}")
        if ids.shape[1] == 0:
            raise ValueError("the prompt is empty: there is nothing to prefill or compress")
        return ids

    def layer_budgets(self, budget: Budget | int | float, prompt_len: int) -> list[int]:
        """Entries per KV head each layer keeps for ``budget`` (the press may spread it over layers)."""
        tokens = Budget.of(budget).tokens(prompt_len)
        return self.press.layer_budgets(tokens, prompt_len, self.model.config.num_hidden_layers)

    def score(self, prompt: Prompt) -> ScoredPrompt:
        """Prefill ``prompt`` and score it with the press; :meth:`evict` then serves any number of budgets."""
        return self._score(self.encode(prompt), with_scores=True)

    @torch.no_grad()
    def _score(self, ids: torch.Tensor, with_scores: bool) -> ScoredPrompt:
        prompt_len = ids.shape[1]
        capture = self.press.prefill_capture(prompt_len) if with_scores else None
        start = clock(self.device)
        cache, next_logits = prefill(self.model, ids, **({} if capture is None else {"lkv_capture": capture}))
        prefilled = clock(self.device)
        scores = None
        if with_scores:
            scores = self.press.score(
                PressContext(self.model, ids, cache, next_logits, capture, self.eos_token_ids, self.tokenizer)
            )
            lengths = {layer.get_seq_length() for layer in cache.layers}
            if lengths != {prompt_len}:
                raise RuntimeError(
                    f"{self.press.name} left {sorted(lengths)} entries per layer in the cache after scoring, "
                    f"expected the prompt's {prompt_len}: a press must crop the tokens it appends"
                )
        scored = clock(self.device)
        return ScoredPrompt(
            ids, cache, next_logits, scores, cache_bytes(cache), prefilled - start, scored - prefilled
        )

    def evict(
        self, scored: ScoredPrompt, budget: Budget | int | float | None = None, in_place: bool = False
    ) -> CompressedPrompt:
        """Keep the top-``C`` entries per (layer, KV head) of a scored prompt.

        Args:
            budget: tokens per KV head or a ratio (:class:`~lkv.core.budget.Budget`); default: the
                Compressor's budget.
            in_place: shrink ``scored.cache`` itself (then ``scored`` serves no other budget). Otherwise
                ``scored.cache`` stays whole and the kept entries are gathered into a new cache: a full copy
                is made only when nothing is evicted (the answer then grows a cache of its own).
        """
        budget = self.budget if budget is None else Budget.of(budget)
        budgets = self.layer_budgets(budget, scored.prompt_len)
        start = clock(self.device)
        kept, appended = None, None
        if any(layer_budget < scored.prompt_len for layer_budget in budgets):
            if scored.scores is None:
                raise ValueError("this prompt was prefilled without scores; score it with Compressor.score()")
            kept = self.select(scored.scores, scored.ids, budget, budgets)
            appended = self._appended(scored)  # on the full cache, before it is gathered
            cache = gather_cache(scored.cache, kept, in_place)  # copies only the kept entries
            if appended is not None:
                append_entries(cache, appended)
                kept = [torch.cat([index, appended.positions(i)], dim=2) for i, index in enumerate(kept)]
        else:  # nothing to evict: the answer grows its own copy of the cache
            cache = scored.cache if in_place else copy.deepcopy(scored.cache)
        evicted = clock(self.device)
        return CompressedPrompt(
            cache=cache,
            next_logits=scored.next_logits,
            prompt_len=scored.prompt_len + (0 if appended is None else appended.length),
            kept=kept,
            scores=scored.scores,
            kv_bytes_full=scored.kv_bytes_full,
            kv_bytes_kept=cache_bytes(cache),
            prefill_s=scored.prefill_s,
            eviction_s=scored.score_s + evicted - start,
            layer_budgets=budgets,
            budget=budget,
        )

    def _appended(self, scored: ScoredPrompt) -> AppendedKV | None:
        """The press's entries to add after eviction (:meth:`Press.appended`), from ``scored``'s full cache."""
        ctx = PressContext(
            self.model, scored.ids, scored.cache, scored.next_logits, None, self.eos_token_ids, self.tokenizer
        )
        appended = self.press.appended(ctx)
        if appended is not None and self.decode_policy is not None:
            raise ValueError(
                f"{self.press.name} adds entries of its own after eviction; the decode-time policy "
                f"{self.decode_policy.name} seeds from the prompt's scores and cannot rank them"
            )
        return appended

    def select(
        self,
        scores: torch.Tensor,
        prompt_ids: torch.Tensor,
        budget: Budget | int | float,
        layer_budgets: list[int] | None = None,
    ) -> list[torch.Tensor]:
        """The positions an eviction to ``budget`` keeps: per layer ``(1, kv_heads, C_l)``, ascending (under
        ``head_budget="adaptive"`` a shorter head's row ends in ``-1`` padding: :func:`select_indices`).

        Args:
            scores: the press's ``(1, layers, kv_heads, S)`` scores of the ``(1, S)`` prompt ``prompt_ids``,
                ranked as the press ranks them at this budget (:meth:`Press.budget_scores`).
            layer_budgets: ``C_l`` per layer when already derived (default: :meth:`layer_budgets`).
        """
        prompt_len, budget = scores.shape[-1], Budget.of(budget)
        if layer_budgets is None:
            layer_budgets = self.layer_budgets(budget, prompt_len)
        ranked = self.press.budget_scores(scores, prompt_ids, budget.tokens(prompt_len))
        selection = self._selection(prompt_len, budget)
        if selection.head_budget == "threshold" and selection.threshold is None:
            selection = replace(selection, threshold=calibrate_threshold([ranked], budget, selection))
        return select_indices(ranked, layer_budgets, selection)

    def calibrate(self, prompts: Iterable[Prompt], budgets: Iterable[Budget]) -> dict[Budget, float]:
        """Per budget, the one threshold that keeps ``C`` entries per (layer, KV head) on average over
        ``prompts`` (:func:`~lkv.eviction.threshold.calibrate_threshold`; each prompt prefilled and scored once,
        its cache let go), for :attr:`thresholds`. The selector's windows are those of each prompt."""
        budgets = [Budget.of(budget) for budget in budgets]
        ranked: dict[Budget, list[torch.Tensor]] = {budget: [] for budget in budgets}
        selections: dict[Budget, list[Selection]] = {budget: [] for budget in budgets}
        for prompt in prompts:
            scored = self.score(prompt)
            for budget in budgets:
                tokens = budget.tokens(scored.prompt_len)
                ranked[budget].append(self.press.budget_scores(scored.scores, scored.ids, tokens))
                selections[budget].append(self._selection(scored.prompt_len, budget))
        return {budget: calibrate_threshold(ranked[budget], budget, selections[budget]) for budget in budgets}

    def _selection(self, prompt_len: int, budget: Budget) -> Selection:
        """The selector's settings with every window it must keep (the method's own, the policy's, the user's)
        and, under ``threshold``, the threshold calibrated for ``budget`` if there is one."""
        selection = self.selection.protecting(*self.press.protected(prompt_len))
        if budget in self.thresholds:
            selection = replace(selection, threshold=self.thresholds[budget])
        if isinstance(self.press, DecodeTimePress):
            # One rule for the whole sequence (as published): the prompt keeps the policy's window too.
            policy = self.press.decode_policy
            selection = selection.protecting(*policy.prompt_window(budget.tokens(prompt_len)))
        return selection

    def compress(self, prompt: Prompt) -> CompressedPrompt:
        """Prefill ``prompt`` and evict down to the budget (nothing is evicted when it fits; nothing is scored
        either, unless a decode-time policy may seed from the scores). Layer by layer when ``streamed``."""
        ids = self.encode(prompt)
        budgets = self.layer_budgets(self.budget, ids.shape[1])
        fits = all(budget >= ids.shape[1] for budget in budgets)
        selection = self._selection(ids.shape[1], self.budget)
        matched = selection.head_budget == "threshold" and selection.threshold is None  # needs every layer
        if self.streamed and self.press.streamable and not fits and not matched:
            return self._compress_streamed(ids, budgets)
        with_scores = not fits or self.decode_policy is not None
        return self.evict(self._score(ids, with_scores=with_scores), in_place=True)

    def _compress_streamed(self, ids: torch.Tensor, budgets: list[int]) -> CompressedPrompt:
        out = streamed_compress(
            self.model,
            self.press,
            ids,
            budgets,
            self._selection(ids.shape[1], self.budget),
            keep_scores=self.decode_policy is not None,  # a decode-time policy may seed from them
            clock=lambda: clock(self.device),
        )
        return CompressedPrompt(
            cache=out.cache,
            next_logits=out.next_logits,
            prompt_len=ids.shape[1],
            kept=out.kept,
            scores=out.scores,
            kv_bytes_full=out.kv_bytes_full,
            kv_bytes_kept=cache_bytes(out.cache),
            prefill_s=out.prefill_s,
            eviction_s=out.eviction_s,
            layer_budgets=budgets,
            budget=self.budget,
        )

    def compress_context(self, context: str | Sequence[int] | torch.Tensor) -> CompressedPrompt:
        """Question-agnostic: compress a context before any question is known (text: :func:`encode_context`)."""
        if isinstance(context, str):
            if self.tokenizer is None:
                raise ValueError(
                    "text contexts need a tokenizer; pass token ids or give Compressor a tokenizer"
                )
            context = encode_context(self.tokenizer, context, self.enable_thinking)
        return self.compress(context)

    def generate(
        self,
        prompt: Prompt,
        sampling: Sampling = GREEDY,
        question: str | Sequence[int] | torch.Tensor | None = None,
    ) -> Generation:
        """Compress ``prompt`` and answer.

        Without ``question`` the whole prompt is compressed (question-aware, as in the paper). With it,
        ``prompt`` is the context: it is compressed first, then ``question`` is appended to the compressed
        cache and answered (question-agnostic).

        Args:
            sampling: answer length, sampling and stop strings (default: greedy, up to 128 tokens).
        """
        if question is None:
            return self.decode(self.compress(prompt), sampling)
        return self.answer(self.compress_context(prompt), question, sampling)

    def decode(self, compressed: CompressedPrompt, sampling: Sampling = GREEDY) -> Generation:
        """Answer a (question-aware) compressed prompt; its cache changes with the answer, so use it once."""
        upkeep = self._begin(compressed, compressed.cache)
        return self._decode(
            compressed,
            compressed.cache,
            compressed.next_logits,
            compressed.prompt_len,
            0.0,
            sampling,
            upkeep,
        )

    @torch.no_grad()
    def answer(
        self,
        context: CompressedPrompt,
        question: str | Sequence[int] | torch.Tensor,
        sampling: Sampling = GREEDY,
    ) -> Generation:
        """Question-agnostic answer: append ``question`` to a copy of a compressed context and decode.

        ``context`` is left untouched, so several questions can reuse it. Text questions are encoded with
        :func:`encode_question` (a blank line, the question, the chat template's closing).
        """
        if isinstance(question, str):
            if self.tokenizer is None:
                raise ValueError(
                    "text questions need a tokenizer; pass token ids or give Compressor a tokenizer"
                )
            question = encode_question(self.tokenizer, question, enable_thinking=self.enable_thinking)
        ids = torch.as_tensor(question, dtype=torch.long, device=self.device).reshape(1, -1)
        if ids.shape[1] == 0:
            raise ValueError("the question is empty")
        cache = copy.deepcopy(context.cache)
        upkeep = self._begin(context, cache)
        start = clock(self.device)
        next_logits = append_tokens(self.model, cache, ids, context.prompt_len, upkeep)
        appended = clock(self.device) - start
        return self._decode(
            context,
            cache,
            next_logits,
            context.prompt_len + ids.shape[1],
            appended,
            sampling,
            upkeep,
        )

    def _begin(self, compressed: CompressedPrompt, cache: DynamicCache) -> CacheUpkeep:
        """The decode-time policy's state for one answer from ``cache`` (a compressed prompt's); without a
        policy, a trace of the cache length."""
        if self.decode_policy is None:
            return CacheTrace()
        press = self.press.press if isinstance(self.press, DecodeTimePress) else self.press
        start = DecodeStart(
            compressed.prompt_len,
            compressed.budget,
            compressed.layer_budgets,
            compressed.kept,
            compressed.scores,
            press,
        )
        return self.decode_policy.begin(self.model, cache, start)

    def _decode(
        self,
        compressed: CompressedPrompt,
        cache: DynamicCache,
        next_logits: torch.Tensor,
        position: int,
        question_s: float,
        sampling: Sampling,
        upkeep: CacheUpkeep,
    ) -> Generation:
        stopper = None
        if sampling.stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer")
            stopper = StopStrings(self.tokenizer, sampling.stop)
        sampler = sampling.sampler()
        start = clock(self.device)
        cache = upkeep.enforce(cache)  # a question appended, or a policy budget below the prompt's
        tokens = decode(
            self.model,
            cache,
            next_logits,
            position,
            sampling.max_new_tokens,
            self.eos_token_ids,
            sampler,
            stopper,
            upkeep,
        )
        decode_s = clock(self.device) - start
        text, reason = answer_text(self.tokenizer, tokens, self.eos_token_ids, stopper)
        return answer_record(compressed, text, tokens, reason, position, question_s, decode_s, upkeep.trace)
