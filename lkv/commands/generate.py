"""`lkv generate`: compress one prompt's KV cache with any method and budget, then generate.

The signature's types are light; the settings' checks, torch and the model are imported once the options
parsed (:mod:`lkv.commands.generate_run`), so `lkv generate --help` and an option error answer at once.
"""

from __future__ import annotations

from lkv.core.context import Truncate
from lkv.eviction.names import FusionRule, HeadBudget, MethodName, PresetName


def generate(
    prompt: str | None = None,
    prompt_file: str | None = None,
    model: str | None = None,
    method: MethodName = "snapkv",
    budget: int | float = 128,
    question: str | None = None,
    adapter: str | None = None,
    probe: str | None = None,
    preset: PresetName | None = None,
    kernel: int | None = None,
    pooling: str | None = None,
    probe_weight: float | None = None,
    fusion: FusionRule | None = None,
    sentences: float | None = None,
    sentences_beyond: int | None = None,
    sentences_scaled: bool | None = None,
    sentences_from_budget: int | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: list[str] | None = None,
    sink: int = 0,
    recent: int = 0,
    selection_kernel: int = 1,
    selection_pooling: str = "max",
    press_args: dict | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
    streamed: bool = False,
    enable_thinking: bool = False,
    head_budget: HeadBudget = "equal",
    threshold: float | None = None,
    truncate: Truncate = "error",
) -> None:
    """Compress a prompt's KV cache with an eviction method and generate an answer (printed to stdout).

    Args:
        prompt: the prompt text (sent as one user message through the model's chat template).
        prompt_file: read the prompt from this file instead.
        model: embedded short name, local folder, ``.gguf`` file or hub id (default: ``smollm2-135m``, or
            the base model named by an ``--adapter`` or ``--probe`` folder or checkpoint).
        method: an eviction method registered in :data:`lkv.eviction.registry.METHODS` (the table in
            docs/evaluation.md): prefill-time ones, and decode-time h2o-decode, scissorhands, quest.
        budget: KV entries kept per head: a whole number of tokens (paper), or a ratio of the prompt in (0, 1].
        question: question-agnostic mode: the prompt is the context, compressed before this question is
            appended and answered.
        adapter: trained lookahead module for ``--method lookaheadkv``: an ``lkv export`` folder or an
            ``lkv fit`` checkpoint (``.ckpt``).
        probe: trained per-token probe for ``--method probe``, or to fuse with ``--method lookaheadkv`` when its
            settings fuse one (default there: the adapter folder's ``probe/``): an ``lkv export`` probe folder or
            a probe checkpoint.
        preset: with ``--method lookaheadkv``: the module's settings by name: ``paper`` (unpooled, alone),
            ``pooled`` (max-pooled over 7, alone), ``long`` (fused with a probe by the union rule, half each;
            from C = 256 on, half of the budget to whole sentences, scaled by the part of the prompt before its
            last 1024 tokens); default: the preset the adapter folder records, else ``pooled``
            (:data:`lkv.eviction.presses.lookahead_settings.PRESETS`). The flags below override its fields.
        kernel, pooling: with ``--method lookaheadkv``: the 1-D pooling of the module's scores (odd kernel, 1 =
            none; ``max`` or ``avg``).
        probe_weight: with ``--method lookaheadkv``: the probe's weight in the fused ranking (0: no probe).
        fusion: how the module and the probe are fused: ``mixture`` (the default) or ``union``
            (:class:`~lkv.eviction.presses.FusedPress`).
        sentences: with ``--method lookaheadkv``: the share of the budget kept as whole sentences around the
            ranking's best tokens, in [0, 1] (:class:`~lkv.eviction.presses.sentences.SentencePress`; 0: none).
        sentences_beyond: the tokens at the end of the prompt kept as single tokens, not sentences (0: sentences
            everywhere).
        sentences_scaled: the share scaled by the part of the prompt before those tokens,
            ``sentences · (S − sentences_beyond) / S`` for an ``S``-token prompt.
        sentences_from_budget: the smallest budget (tokens per KV head) the sentence share applies at.
        max_new_tokens: longest answer.
        temperature: 0 = greedy; otherwise sampling temperature.
        top_p: nucleus sampling mass (with temperature > 0).
        seed: sampling seed.
        stop: strings that end the answer (besides EOS).
        sink: leading prompt tokens always kept.
        recent: trailing prompt tokens always kept.
        selection_kernel: the selector's 1-D pooling kernel, applied to any method's scores before selection
            (1 = none).
        selection_pooling: the selector's pooling, ``max`` or ``avg``.
        press_args: the method's own settings, e.g. ``{"window": 16}`` for snapkv; for ``--method lookaheadkv``
            its settings as ``lkv eval``'s press_args give them (``{"preset": "long", "kernel": 5}``).
        dtype: model weights dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: ``sdpa`` (default) or ``eager``.
        device: ``cpu``, ``cuda``, ... (default: CPU).
        streamed: layer-streamed eviction (snapkv, pyramidkv, tova, h2o, streamingllm, random, lookaheadkv,
            expected_attention, keydiff, probe): each layer is cut to its budget as soon as the prefill has produced it,
            so only one layer's full K/V lives at a time; the same answer. Other methods keep the two-phase path.
        head_budget: ``equal`` (every KV head keeps ``budget``), ``adaptive`` (AdaKV: each layer keeps
            ``budget · kv_heads`` entries, spread over its heads by score, each head keeping at least 20 %) or
            ``threshold`` (KVzap's DMS: every entry whose normalised score passes ``--threshold``, so each head and
            layer keeps its own count; without ``--threshold``, the one that keeps ``budget`` entries per layer
            and KV head on average over this prompt).
        threshold: with ``--head_budget threshold``, the least normalised score kept: ``log(S · share)`` of the
            method's scores (0: a uniform share; :func:`lkv.eviction.selector.normalised_scores`).
        enable_thinking: the chat template's variable the prompt and question are rendered with. Off by
            default, as ``lkv label`` and ``lkv eval`` render theirs: Qwen3 then answers without reasoning first.
        truncate: a prompt that does not fit in the model's context with the question and ``max_new_tokens``
            after it: ``error`` (refused, with both lengths), ``left`` (keep its last tokens) or ``middle``
            (keep its first and last halves). Checked before the prefill.
    """
    options = dict(locals())  # every option, before the imports below add their names
    from lkv.commands.generate_run import generate_answer
    from lkv.commands.generate_settings import GenerateSettings

    generate_answer(GenerateSettings(**options))
