"""`lkv eval`: eviction methods × budgets × tasks × settings, with reports, plots and TensorBoard logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from lkv.commands.signals import exit_on_sigterm
from lkv.core.budget import Budget
from lkv.core.chat import template_kwargs, template_reads_variables
from lkv.core.context import Truncate
from lkv.eval.report import REPORT_FILE, write_report
from lkv.eval.results import (
    RESULTS_FILE,
    ResultsFile,
    adapter_method,
    check_run,
    fingerprint,
    unrecorded_keys,
)
from lkv.eval.runner import SETTINGS, Evaluator, Setting
from lkv.eval.tasks import Benchmark
from lkv.eviction.presses import OraclePress, Press, ProbePress
from lkv.eviction.presses.lookahead_settings import LookaheadKVSettings
from lkv.eviction.presses.lookaheadkv import folder_defaults, load_module, lookahead_press
from lkv.eviction.registry import (
    ADAPTER_METHOD,
    DEFAULT_METHODS,
    METHODS,
    PROBE_METHOD,
    MethodName,
    check_press_args,
    make_method,
    roles_of,
)
from lkv.eviction.selector import HeadBudget, Selection
from lkv.model.backbone import load_backbone
from lkv.model.lookahead import LookaheadAdapter
from lkv.train.export import resolve_adapter, resolve_probe

# run.json's record of the chat template's variables (label folders keep it in meta.json's extra)
TEMPLATE_KEY = "chat_template_kwargs"

# the method name of a module given in `--adapters` (`lookaheadkv:<name>`)
LOOKAHEAD_PREFIX = f"{ADAPTER_METHOD}:"

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
    for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens)):
        if value is not None and value <= 0:
            raise ValueError(f"--{name}: expected a positive number, found {value}")
    # a bad budget ends the run here, before any model loads (it would otherwise surface after the prefills)
    if not budgets:
        raise ValueError("--budgets: give at least one budget (tokens per KV head, or a ratio in (0, 1])")
    try:
        checked = [Budget.of(budget) for budget in budgets]
    except (TypeError, ValueError) as error:
        raise ValueError(f"--budgets: {error}") from None
    methods = list(dict.fromkeys(m.lower() for m in methods))
    if (ADAPTER_METHOD in methods) != (adapter is not None):
        raise ValueError(f"--adapter is required by the {ADAPTER_METHOD} method and used by no other method")
    decode_time = [m for m in methods if m in METHODS and METHODS[m].acts == "decode"]
    if head_budget != "equal" and decode_time:
        raise ValueError(
            f"--head_budget {head_budget} spreads a prefill-time method's budget over the heads; the decode-time "
            f"methods {decode_time} keep equal budgets while decoding: leave them out of --methods"
        )
    adapters = dict(adapters or {})
    if adapters and adapter is None:
        raise ValueError("--adapters adds lookahead modules beside --adapter's; give --adapter too")
    bad_names = [n for n in adapters if not n or not all(c.isalnum() or c in "_-." for c in n)]
    if bad_names:
        raise ValueError(
            f"--adapters: names must be non-empty letters, digits, '_', '-' or '.', got {bad_names}"
        )
    methods += [f"{LOOKAHEAD_PREFIX}{name}" for name in adapters]
    press_args = dict(press_args or {})
    # the reference keeps everything, the upper bound is scored from its answer, a probe's settings are its own
    takes_settings = {m for m in methods if roles_of(m).role == "method" and roles_of(m).requires != "probe"}
    unused = sorted(set(press_args) - takes_settings)
    if unused:
        raise ValueError(
            f"press_args given for {unused}: only evaluated methods other than fullkv, oracle (scored from the "
            "FullKV answer) and probe (settings come from its folder) take settings"
        )
    for method, own in press_args.items():
        check_press_args(method, own)
    # each lookahead module's settings and probe, from press_args and its folder, checked before any model loads
    folders = {ADAPTER_METHOD: adapter, **{f"{LOOKAHEAD_PREFIX}{n}": f for n, f in adapters.items()}}
    module_settings: dict[str, LookaheadKVSettings] = {}
    module_probes: dict[str, str | Path | None] = {}
    for method in (m for m in methods if adapter_method(m)):
        defaults = folder_defaults(folders[method])
        try:
            module_settings[method] = defaults.settings(press_args.get(method))
        except ValueError as error:
            raise ValueError(f"press_args for {method}: {error}") from None
        module_probes[method] = defaults.probe_for(
            module_settings[method], probe, f"{method} ({folders[method]})"
        )
        # run.json records every module's settings, the default's too: rows scored with others are not resumed
        press_args[method] = module_settings[method].record()
    fused = [m for m, s in module_settings.items() if s.needs_probe]
    if (PROBE_METHOD in methods) != (probe is not None) and not (fused and PROBE_METHOD not in methods):
        raise ValueError(
            f"--probe is required by the {PROBE_METHOD} method, used by lookahead modules whose settings fuse a "
            "probe (probe_weight > 0; default: their folder's probe/), and by nothing else"
        )
    # FullKV's and the training-free presses need no model: built before run.json records their settings, so a
    # bad one (a negative SnapKV window) is refused with the folder untouched and the corrected command runs in it
    presses: dict[str, Press] = {}
    for method in methods:
        if not roles_of(method).requires and roles_of(method).role != "upper bound":
            try:
                presses[method] = make_method(method, **press_args.get(method, {}))
            except (TypeError, ValueError) as error:
                raise ValueError(f"press_args for {method}: {error}") from None
    out = Path(output)
    run_info = {
        "model": model,
        "adapter": None if adapter is None else fingerprint(adapter),
        **({"adapters": {n: fingerprint(f) for n, f in adapters.items()}} if adapters else {}),
        "probe": None if probe is None else fingerprint(probe),
        "press_args": press_args,
        "dtype": dtype,
        TEMPLATE_KEY: template_kwargs(enable_thinking),
        "head_budget": head_budget,
        "truncate": truncate,
    }
    # a folder from before run.json recorded the template's variables: compared once the tokenizer is loaded
    legacy = unrecorded_keys(out, [TEMPLATE_KEY])
    check_run(out, {k: v for k, v in run_info.items() if k not in legacy})
    if adapter is not None:
        net, tokenizer, module = load_module(
            resolve_adapter(adapter, model), model, dtype, attn_implementation, device
        )
    else:
        net, tokenizer = load_backbone(
            model, dtype=dtype, attn_implementation=attn_implementation, device=device
        )
    if legacy:
        check_legacy_template(out, tokenizer, model)
        check_run(out, run_info, unrecorded=legacy)
    probes: dict[Path, ProbePress] = {}  # one press per probe folder, shared by the methods that fuse it

    def probe_press(path: str | Path | None) -> ProbePress | None:
        if path is None:
            return None
        folder = resolve_probe(path, model)
        if folder not in probes:
            probes[folder] = ProbePress.from_folder(folder, net)
        return probes[folder]

    for method in methods:
        if method in presses:
            continue
        roles = roles_of(method)
        if roles.requires == "adapter":
            if method != ADAPTER_METHOD:  # LoRAs beside the first module's, on the same model
                name = method.removeprefix(LOOKAHEAD_PREFIX)
                module_of = LookaheadAdapter.load(
                    resolve_adapter(folders[method], model),
                    module.model,
                    adapter_name=f"lookahead_{name}".replace(".", "_"),
                )
            else:
                module_of = module
            presses[method] = lookahead_press(
                module_of, probe_press(module_probes[method]), module_settings[method], tokenizer
            )
        elif roles.requires == "probe":
            presses[method] = probe_press(probe)
        else:  # the upper bound (the only method left unbuilt)
            presses[method] = OraclePress()  # selection defaults only; its scores come from the FullKV answer
    start = time.perf_counter()
    evaluator = Evaluator(
        net,
        tokenizer,
        presses,
        checked,
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
    title = title or out.name
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
