"""`lkv eval`: eviction methods × budgets × tasks × settings, with reports, plots and TensorBoard logs.

The signature's types are light (the task classes, :mod:`lkv.eviction.names`, :mod:`lkv.eval.prompt_settings`);
the settings' checks, torch and the model are imported once the options parsed (:mod:`lkv.commands.eval_run`),
so `lkv eval --help` and an option error answer at once.
"""

from __future__ import annotations

from typing import Any

from lkv.core.context import Truncate
from lkv.eval.prompt_settings import SETTINGS, Setting
from lkv.eval.tasks import Benchmark
from lkv.eviction.names import DEFAULT_METHODS, HeadBudget, MethodName


def evaluate(
    tasks: list[Benchmark],
    methods: tuple[MethodName, ...] = DEFAULT_METHODS,
    budgets: tuple[int | float, ...] = (64, 128),
    settings: tuple[Setting, ...] = SETTINGS,
    output: str = "reports/eval",
    model: str = "smollm2-135m",
    adapter: str | None = None,
    adapters: dict[str, str] | None = None,
    variants: tuple[str, ...] = (),
    probe: str | None = None,
    press_args: dict[str, dict[str, Any]] | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
    progress: bool = True,
    title: str | None = None,
    streamed: bool = False,
    batch_size: int = 8,
    max_batch_tokens: int | None = None,
    enable_thinking: bool = False,
    head_budget: HeadBudget = "equal",
    truncate: Truncate = "error",
    shard: str | None = None,
    only_solved: str | None = None,
) -> str:
    """Evaluate eviction methods × budgets × tasks × settings; write results, a report, plots and TensorBoard logs.

    Args:
        tasks: benchmarks, e.g. ``[{class_path: lkv.eval.tasks.NeedleTask, init_args: {lengths: [1024]}}]``.
        methods: eviction methods, by their names in :data:`lkv.eviction.registry.METHODS` (the table in
            docs/evaluation.md); the default is every method of the default list.
        budgets: KV entries kept per head: whole numbers of tokens (paper) or ratios of the prompt in (0, 1].
        settings: ``aware`` (question inside the compressed prompt, as in the paper) and/or ``agnostic``
            (context compressed before the question is appended).
        output: result folder; rerunning the same command resumes it (finished rows are skipped; a rerun that
            adds no row leaves the report as it was: delete report.md to write it again).
        model: embedded short name, local folder, ``.gguf`` file or hub id.
        adapter: trained lookahead module for ``lookaheadkv``: an ``lkv export`` folder or an ``lkv fit``
            checkpoint (``.ckpt``).
        adapters: more lookahead modules, name → folder or checkpoint, each evaluated as the method
            ``lookaheadkv:<name>`` on the same prefills as ``lookaheadkv`` (paired; one prefill for all), e.g.
            two seeds or a before/after pair. Needs ``adapter`` (the ``lookaheadkv`` rows) and the same base model.
        variants: more entries of a method that takes settings, each ``<method>:<name>`` (e.g.
            ``restorekv:lookahead``, ``snapkv:w64``), evaluated as that method under its own ``press_args`` on the
            same prefills as the others: one method at two settings side by side, paired. Lookahead modules are
            added with ``adapters`` instead; FullKV, the Oracle and the probe take no settings.
        probe: trained per-token probe for ``probe``: an ``lkv export`` probe folder or a probe checkpoint.
        press_args: per-method settings, e.g. ``{snapkv: {window: 16}, lookaheadkv: {preset: long}}``: each
            method's keyword arguments; a lookahead module's are its settings
            (:class:`lkv.eviction.presses.lookahead_settings.LookaheadKVSettings`): a preset (``paper``,
            ``pooled``, ``long``; default: the one its adapter folder records, else ``pooled``) and flat keys
            that override it (``kernel``, ``pooling``, ``probe_weight``, ``fusion``, ``sentences``,
            ``sentences_beyond``, ``sentences_scaled``, ``sentences_from_budget``). E.g. ``lookaheadkv:s0_long:
            {preset: long}`` with ``adapters: {s0_long: <the s0 folder>}`` evaluates the long-prompt preset
            beside the module alone. Unknown keys end the run before any model loads.
        dtype: model weights dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: ``sdpa`` (default) or ``eager``.
        device: ``cpu``, ``cuda``, ... (default: CPU).
        progress: show progress bars.
        title: report title (default: the output folder's name).
        streamed: layer-streamed eviction for the methods that allow it (snapkv, pyramidkv, tova, h2o,
            streamingllm, random, lookaheadkv, expected_attention, keydiff, probe): each (prompt, budget) gets
            its own prefill in which every layer is cut to its budget before the next one runs; same answers,
            one layer's full K/V at a time.
        batch_size: answers decoded together for the methods whose cache is fixed after eviction (all but the
            decode-time ones), and (sample, setting) pairs prefilled per chunk (their full caches are held
            at once); the same answers as 1, which decodes one at a time. Default 8 (docs/performance.md).
        max_batch_tokens: the most cached tokens a chunk's stacked full caches hold (pairs × the longest
            prompt): long prompts get chunks of fewer than ``batch_size`` pairs. Default: half of the free GPU
            memory over one token's K/V bytes (no limit on a CPU). Peak memory: docs/scale_out.md, "Evaluation
            memory".
        enable_thinking: the chat template's variable every prompt is rendered with. Off by default, as
            ``lkv label`` renders the training prompts: Qwen3's template then closes an empty think block and
            the model answers at once (on, it reasons first and short answers score about 0). Recorded in
            ``run.json`` (``chat_template_kwargs``); a rerun into the folder must use the same value.
        head_budget: how each method's per-head budget ``C`` is spread over the KV heads of a layer: ``equal``
            (every head keeps ``C``, the paper's), ``adaptive`` (AdaKV: each layer keeps ``C · kv_heads``
            entries, spread over its heads by score, each head keeping at least 20 % of ``C``) or ``threshold``
            (KVzap's DMS: every entry whose normalised score passes one threshold per task, method and budget,
            calibrated on the task's prompts so the mean kept entries per layer and KV head is ``C``; its rows
            add ``threshold`` and ``kept_std``). One setting for the whole run, recorded in ``run.json``:
            compare them in separate output folders.
        truncate: a sample that does not fit in the model's context with its question and answer tokens:
            ``error`` (the run stops before the task's first prefill, naming the sample and both lengths),
            ``left`` (keep the context's last tokens) or ``middle`` (keep its first and last halves). Recorded
            in ``run.json``: a rerun into the folder must cut its prompts alike.
        shard: ``k/n``: run only every ``n``-th sample of each task, from the ``k``-th (:mod:`lkv.eval.shard`), so
            ``n`` processes or machines with the same command and ``--shard 1/n`` … ``n/n`` fill one output folder
            together (a shared file system). Each writes a report of the rows present when it ends, marked
            partial; once all have ended, the command without ``--shard`` adds no row and writes the complete
            report. Not with ``--head_budget threshold`` (its thresholds are calibrated on all of a task's prompts).
        only_solved: an earlier ``lkv eval`` folder (or its ``results.jsonl``): run only the (sample, setting)
            pairs its FullKV rows answered right (:mod:`lkv.eval.screen`), so new methods are scored on exactly
            a committed set's solved samples, paired with its rows by sample id. End tasks only; every task and
            setting of the run needs FullKV rows there.
    """
    options = {k: v for k, v in locals().items() if k != "tasks"}  # every option but the tasks
    from lkv.commands.eval_run import run_eval
    from lkv.commands.eval_settings import EvalSettings

    return run_eval(tasks, EvalSettings(**options))
