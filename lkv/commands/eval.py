"""`lkv eval`: eviction methods × budgets × tasks × settings, with reports, plots and TensorBoard logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.commands.eval_settings import LOOKAHEAD_PREFIX, TEMPLATE_KEY, EvalSettings
from lkv.commands.signals import exit_on_sigterm
from lkv.core.chat import template_reads_variables
from lkv.core.context import Truncate
from lkv.eval.report import REPORT_FILE, write_report
from lkv.eval.results import RESULTS_FILE, ResultsFile, check_run, unrecorded_keys
from lkv.eval.runner import Evaluator
from lkv.eval.setup import SETTINGS, Setting
from lkv.eval.tasks import Benchmark
from lkv.eviction.names import HeadBudget, MethodName
from lkv.eviction.presses import OraclePress, Press, ProbePress
from lkv.eviction.presses.lookaheadkv import load_module, lookahead_press
from lkv.eviction.registry import ADAPTER_METHOD, DEFAULT_METHODS, roles_of
from lkv.eviction.selector import Selection
from lkv.model.backbone import load_backbone
from lkv.model.lookahead import LookaheadAdapter
from lkv.train.export import resolve_adapter, resolve_probe

# how the report of an interrupted run begins its warning (a resumed run rewrites such a report)
PARTIAL_MARK = "**Partial report**"


def evaluate(
    tasks: list[Benchmark],
    methods: tuple[MethodName, ...] = DEFAULT_METHODS,
    budgets: tuple[int | float, ...] = (64, 128),
    settings: tuple[Setting, ...] = SETTINGS,
    output: str = "reports/eval",
    model: str = "smollm2-135m",
    adapter: str | None = None,
    adapters: dict[str, str] | None = None,
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
    """
    run = EvalSettings(**{k: v for k, v in locals().items() if k != "tasks"})  # every option but the tasks
    out = Path(output)
    # a folder from before run.json recorded the template's variables: compared once the tokenizer is loaded
    legacy = unrecorded_keys(out, [TEMPLATE_KEY])
    presses = (
        run.training_free_presses()
    )  # before run.json is written: a bad setting leaves the folder as it was
    check_run(out, {k: v for k, v in run.run_info().items() if k not in legacy})
    if adapter is not None:
        net, tokenizer, module = load_module(
            resolve_adapter(adapter, model), model, dtype, attn_implementation, device
        )
    else:
        net, tokenizer = load_backbone(
            model, dtype=dtype, attn_implementation=attn_implementation, device=device
        )
        module = None
    if legacy:
        check_legacy_template(out, tokenizer, model)
        check_run(out, run.run_info(), unrecorded=legacy)
    presses |= model_presses(run, net, tokenizer, module)
    evaluator = Evaluator(
        net,
        tokenizer,
        presses,
        run.checked_budgets,
        settings,
        out,
        progress,
        streamed,
        batch_size,
        enable_thinking,
        max_batch_tokens,
        Selection(head_budget=head_budget),
        truncate=truncate,
    )
    return run_and_report(evaluator, tasks, out, title or out.name, run.methods_run)


def model_presses(
    run: EvalSettings,
    net: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    module: LookaheadAdapter | None,
) -> dict[str, Press]:
    """The presses of ``run``'s methods that need the loaded model: each lookahead module (``module``, the one
    ``--adapter`` names, and the LoRAs of ``--adapters`` loaded beside it on the same model), the probe (one
    press per probe folder, shared by the methods that fuse it) and the Oracle."""
    probes: dict[Path, ProbePress] = {}

    def probe_press(path: str | Path | None) -> ProbePress | None:
        if path is None:
            return None
        folder = resolve_probe(path, run.model)
        if folder not in probes:
            probes[folder] = ProbePress.from_folder(folder, net)
        return probes[folder]

    presses: dict[str, Press] = {}
    for method in run.methods_run:
        roles = roles_of(method)
        if roles.requires == "adapter":
            if method != ADAPTER_METHOD:  # LoRAs beside the first module's, on the same model
                name = method.removeprefix(LOOKAHEAD_PREFIX)
                module_of = LookaheadAdapter.load(
                    resolve_adapter(run.folders[method], run.model),
                    module.model,
                    adapter_name=f"lookahead_{name}".replace(".", "_"),
                )
            else:
                module_of = module
            presses[method] = lookahead_press(
                module_of, probe_press(run.module_probes[method]), run.module_settings[method], tokenizer
            )
        elif roles.requires == "probe":
            presses[method] = probe_press(run.probe)
        elif roles.role == "upper bound":
            presses[method] = OraclePress()  # selection defaults only; its scores come from the FullKV answer
    return presses


def run_and_report(
    evaluator: Evaluator, tasks: list[Benchmark], out: Path, title: str, methods: list[str]
) -> str:
    """Run ``tasks`` and write the report of ``out``'s rows; an interrupted run (Ctrl-C, SIGTERM) gets a partial
    report of its rows so far. Returns the verb's closing line."""
    start = time.perf_counter()
    # the rows the folder held before this run, as the evaluator read them (no second parse of the file)
    known = len(evaluator.results.rows)
    try:
        with exit_on_sigterm():
            evaluator.run(tasks)
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C or SIGTERM (a pre-empted job, a session's end): the rows so far get their report too.
        rows = ResultsFile(out / RESULTS_FILE).rows
        write_report(rows, out, title=title, methods=methods, notes=[interrupted_note(len(rows))])
        raise
    seconds = time.perf_counter() - start
    # Read back the file, not the evaluator's rows: another process may fill the same folder (one per setting).
    rows = ResultsFile(out / RESULTS_FILE).rows
    report = out / REPORT_FILE
    # a resumed run that added nothing leaves the report, its plots and its TensorBoard files as they were
    # (rewriting them would only churn a committed folder); a partial report is completed all the same
    if len(rows) > known or not report.exists() or PARTIAL_MARK in report.read_text(encoding="utf-8"):
        report = write_report(rows, out, title=title, methods=methods)
        return f"lkv eval: {len(rows)} result rows in {out / RESULTS_FILE} ({seconds:.0f} s this run); report: {report}"
    return f"lkv eval: {len(rows)} result rows in {out / RESULTS_FILE}, none new; report left as it was: {report}"


def check_legacy_template(output: Path, tokenizer: PreTrainedTokenizerBase, model: str) -> None:
    """Resume a folder whose ``run.json`` predates ``chat_template_kwargs`` only when ``model``'s chat template
    ignores those variables (its prompts were rendered exactly as now); Qwen3's reads ``enable_thinking``."""
    if template_reads_variables(tokenizer):
        raise ValueError(
            f"{output} holds results from before run.json recorded {TEMPLATE_KEY}, and the chat template of "
            f"{model} reads them (e.g. Qwen3's enable_thinking), so its prompts may have been rendered "
            "differently; use another --output or delete the folder"
        )


def interrupted_note(rows: int) -> str:
    """The report's warning that its cells are not all filled (the run stopped before its end)."""
    return (
        f"{PARTIAL_MARK}: the run was interrupted with {rows} rows in `{RESULTS_FILE}`, so some cells hold "
        "fewer samples than the config asks for (each cell gives its n). Rerun the same command to resume."
    )
