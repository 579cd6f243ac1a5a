"""`lkv eval`'s run (:func:`run_eval`): the model, the presses of its methods, the evaluation and its report.
Torch and transformers are imported here, once the options are parsed and checked, so `lkv eval --help` stays
light."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.commands.eval_settings import LOOKAHEAD_PREFIX, TEMPLATE_KEY, EvalSettings
from lkv.commands.signals import exit_on_sigterm
from lkv.core.chat import template_reads_variables
from lkv.eval.prompt_settings import Setting
from lkv.eval.report import REPORT_FILE, write_report
from lkv.eval.results import RESULTS_FILE, ResultsFile, check_run, unrecorded_keys
from lkv.eval.runner import Evaluator, run_end_task, run_of
from lkv.eval.screen import SolvedScreen
from lkv.eval.shard import Shard
from lkv.eval.tasks import Benchmark, check_settings, settings_run
from lkv.eviction.presses import OraclePress, Press, ProbePress
from lkv.eviction.presses.lookaheadkv import load_module, lookahead_press
from lkv.eviction.presses.restorekv import RestoreKVPress
from lkv.eviction.roles import ADAPTER_METHOD, roles_of
from lkv.eviction.selector import Selection
from lkv.model.backbone import load_backbone
from lkv.model.lookahead import CONFIG_FILE, SETTING_KEY, LookaheadAdapter, trained_setting
from lkv.model.restore import RESTORE_CONFIG_FILE
from lkv.train.export import resolve_adapter, resolve_probe

# how the report of an interrupted run begins its warning (a resumed run rewrites such a report)
PARTIAL_MARK = "**Partial report**"


def run_eval(tasks: list[Benchmark], run: EvalSettings) -> str:
    """Evaluate ``tasks`` with ``run``'s checked options (:func:`lkv.commands.eval.evaluate` gives each); returns
    the verb's closing line."""
    check_settings(tasks, run.settings)  # before the model loads
    for method, own in run.replaced_probes.items():
        # --probe is one probe for the whole run: a second seed's module would fuse the first seed's probe
        print(
            f"lkv eval: warning: {method} fuses --probe {run.probe}, not its folder's own probe {own}",
            file=sys.stderr,
        )
    screen = None if run.only_solved is None else solved_screen(tasks, run)
    out = Path(run.output)
    # a folder from before run.json recorded the template's variables: compared once the tokenizer is loaded
    legacy = unrecorded_keys(out, [TEMPLATE_KEY])
    presses = (
        run.training_free_presses()
    )  # before run.json is written: a bad setting leaves the folder as it was
    check_run(out, {k: v for k, v in run.run_info().items() if k not in legacy})
    if run.adapter is not None:
        net, tokenizer, module = load_module(
            resolve_adapter(run.adapter, run.model), run.model, run.dtype, run.attn_implementation, run.device
        )
    else:
        net, tokenizer = load_backbone(
            run.model, dtype=run.dtype, attn_implementation=run.attn_implementation, device=run.device
        )
        module = None
    if legacy:
        check_legacy_template(out, tokenizer, run.model)
        check_run(out, run.run_info(), unrecorded=legacy)
    presses |= model_presses(run, net, tokenizer, module, settings_run(tasks, run.settings))
    evaluator = Evaluator(
        net,
        tokenizer,
        presses,
        run.checked_budgets,
        run.settings,
        out,
        run.progress,
        run.streamed,
        run.batch_size,
        run.enable_thinking,
        run.max_batch_tokens,
        Selection(head_budget=run.head_budget),
        truncate=run.truncate,
        shard=run.checked_shard,
        screen=screen,
    )
    return run_and_report(evaluator, tasks, out, run.title or out.name, run.methods_run)


def solved_screen(tasks: list[Benchmark], run: EvalSettings) -> SolvedScreen:
    """``--only_solved``'s screen of ``tasks`` (end tasks only: they alone have FullKV answers per prompt)."""
    other = [t.name for t in tasks if run_of(t) is not run_end_task]
    if other:
        raise ValueError(
            f"--only_solved screens end tasks by their FullKV answers; {', '.join(other)} has none"
        )
    return SolvedScreen.load(run.only_solved, [t.name for t in tasks], run.settings)


def model_presses(
    run: EvalSettings,
    net: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    module: LookaheadAdapter | None,
    settings: Sequence[Setting],
) -> dict[str, Press]:
    """The presses of ``run``'s methods that need the loaded model: each lookahead module (``module``, the one
    ``--adapter`` names, and the LoRAs of ``--adapters`` loaded beside it on the same model), the probe (one
    press per probe folder, shared by the methods that fuse it), a RestoreKV module (its ``press_args``' folder;
    its evictor KVzip, or ``scores: lookaheadkv`` the lookahead module's press) and the Oracle. ``settings``:
    the prompt settings the tasks run in, which a module trained for another one is warned about."""
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
            folder = resolve_adapter(run.folders[method], run.model)
            warn_setting(method, folder / CONFIG_FILE, module_of.config.extra, settings)
            presses[method] = lookahead_press(
                module_of, probe_press(run.module_probes[method]), run.module_settings[method], tokenizer
            )
        elif roles.requires == "probe":
            presses[method] = probe_press(run.probe_folders[method])
        elif roles.role == "upper bound":
            presses[method] = OraclePress()  # selection defaults only; its scores come from the FullKV answer
    for method in run.methods_run:  # after the lookahead module's press, which may select for it
        if roles_of(method).requires == "restore":
            args = dict(run.recorded_press_args[method])
            evictor = presses[ADAPTER_METHOD] if args.pop("scores", None) == ADAPTER_METHOD else None
            model = net if module is None else module.model  # its LoRA joins a lookahead module's
            name = method.replace(":", "_").replace(
                ".", "_"
            )  # one peft adapter per entry: variants side by side
            presses[method] = RestoreKVPress.from_folder(
                model=model, evictor=evictor, adapter_name=name, **args
            )
            config = Path(args["folder"]) / RESTORE_CONFIG_FILE
            warn_setting(method, config, presses[method].adapter.config.extra, settings)
    return presses


def warn_setting(method: str, config: Path, extra: Mapping[str, Any], settings: Sequence[str]) -> None:
    """Print one warning line to stderr when ``method``'s learned tokens (a lookahead module or RestoreKV's
    restore tokens; their folder's ``config`` file holds ``extra``) run in a prompt setting of ``settings`` other
    than the one they were trained for (:func:`lkv.model.lookahead.trained_setting`): aware-trained tokens read
    the question before they ran, which the agnostic setting asks only after the cache is compressed, and
    agnostic-trained ones never learned to use it. Nothing when every setting is their own."""
    trained = trained_setting(extra, str(config))
    others = [s for s in settings if s != trained]
    if others:
        print(
            f"lkv eval: warning: {method}'s module {config.parent} was trained for the {trained} setting "
            f"({config.name} extra.{SETTING_KEY}) and runs here in the {' and '.join(others)} setting too",
            file=sys.stderr,
        )


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
    if not evaluator.shard.whole:  # other shards may still be running: a report of the rows so far, marked so
        report = write_report(
            rows, out, title=title, methods=methods, notes=[shard_note(evaluator.shard, len(rows))]
        )
        return (
            f"lkv eval: shard {evaluator.shard} done; {len(rows)} result rows in {out / RESULTS_FILE} "
            f"({seconds:.0f} s this run); partial report: {report}"
        )
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


def shard_note(shard: Shard, rows: int) -> str:
    """The report's warning that a shard wrote it, with the rows the folder held when that shard ended."""
    return (
        f"{PARTIAL_MARK}: shard {shard} wrote this report when it ended, with the {rows} rows then in "
        f"`{RESULTS_FILE}`; other shards may add more. Once every shard has ended, the same command without "
        "--shard adds no row and writes the complete report."
    )


def interrupted_note(rows: int) -> str:
    """The report's warning that its cells are not all filled (the run stopped before its end)."""
    return (
        f"{PARTIAL_MARK}: the run was interrupted with {rows} rows in `{RESULTS_FILE}`, so some cells hold "
        "fewer samples than the config asks for (each cell gives its n). Rerun the same command to resume."
    )
