"""`lkv eval`: eviction methods × budgets × tasks × settings, with reports, plots and TensorBoard logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lkv.commands.signals import exit_on_sigterm
from lkv.eval.report import write_report
from lkv.eval.results import RESULTS_FILE, ResultsFile, adapter_method, check_run, fingerprint
from lkv.eval.runner import SETTINGS, Evaluator, Setting
from lkv.eval.tasks import Benchmark
from lkv.eviction.compressor import load_lookahead
from lkv.eviction.presses import LookaheadKVPress, OraclePress, Press
from lkv.eviction.registry import DEFAULT_METHODS, MethodName, make_method
from lkv.model.backbone import load_backbone
from lkv.train.export import resolve_adapter

# the method name of a module given in `--adapters` (`lookaheadkv:<name>`)
LOOKAHEAD_PREFIX = "lookaheadkv:"


def evaluate(
    tasks: list[Benchmark],
    methods: tuple[MethodName, ...] = DEFAULT_METHODS,
    budgets: tuple[int | float, ...] = (64, 128),
    settings: tuple[Setting, ...] = SETTINGS,
    output: str = "reports/eval",
    model: str = "smollm2-135m",
    adapter: str | None = None,
    adapters: dict[str, str] | None = None,
    press_args: dict[str, dict[str, Any]] | None = None,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    device: str | None = None,
    progress: bool = True,
    title: str | None = None,
    streamed: bool = False,
    batch_size: int = 8,
) -> str:
    """Evaluate eviction methods × budgets × tasks × settings; write results, a report, plots and TensorBoard logs.

    Args:
        tasks: benchmarks, e.g. ``[{class_path: lkv.eval.tasks.NeedleTask, init_args: {lengths: [1024]}}]``.
        methods: eviction methods, by their names in :data:`lkv.eviction.registry.METHODS` (the table in
            docs/evaluation.md); the default is every method of the default list.
        budgets: KV entries kept per head: whole numbers of tokens (paper) or ratios of the prompt in (0, 1].
        settings: ``aware`` (question inside the compressed prompt, as in the paper) and/or ``agnostic``
            (context compressed before the question is appended).
        output: result folder; rerunning the same command resumes it (finished rows are skipped).
        model: embedded short name, local folder, ``.gguf`` file or hub id.
        adapter: trained lookahead module for ``lookaheadkv``: an ``lkv export`` folder or an ``lkv fit``
            checkpoint (``.ckpt``).
        adapters: more lookahead modules, name → folder or checkpoint, each evaluated as the method
            ``lookaheadkv:<name>`` on the same prefills as ``lookaheadkv`` (paired; one prefill for all), e.g.
            two seeds or a before/after pair. Needs ``adapter`` (the ``lookaheadkv`` rows) and the same base model.
        press_args: per-method settings, e.g. ``{snapkv: {window: 16}, lookaheadkv: {kernel: 7}}`` (a lookahead
            module takes only its pooling: kernel, pooling).
        dtype: model weights dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: ``sdpa`` (default) or ``eager``.
        device: ``cpu``, ``cuda``, ... (default: CPU).
        progress: show progress bars.
        title: report title (default: the output folder's name).
        streamed: layer-streamed eviction for the methods that allow it (snapkv, pyramidkv, tova, h2o,
            streamingllm, random, lookaheadkv): each (prompt, budget) gets its own prefill in which every layer is
            cut to its budget before the next one runs; same answers, one layer's full K/V at a time.
        batch_size: answers decoded together for the methods whose cache is fixed after eviction (all but the
            decode-time ones), and (sample, setting) pairs prefilled per chunk (their full caches are held
            at once); the same answers as 1, which decodes one at a time. Default 8 (docs/performance.md).
    """
    methods = list(dict.fromkeys(m.lower() for m in methods))
    if ("lookaheadkv" in methods) != (adapter is not None):
        raise ValueError("--adapter is required by the lookaheadkv method and used by no other method")
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
    unused = sorted(set(press_args) - (set(methods) - {"fullkv", "oracle"}))
    if unused:
        raise ValueError(
            f"press_args given for {unused}: only evaluated methods other than fullkv and oracle (scored from "
            "the FullKV answer) take settings"
        )
    for method, own in press_args.items():
        if adapter_method(method) and not set(own) <= {"kernel", "pooling"}:
            raise ValueError(
                f"press_args for {method}: a lookahead module takes only kernel and pooling (its other "
                f"settings come from its adapter folder), got {sorted(own)}"
            )
    out = Path(output)
    check_run(
        out,
        {
            "model": model,
            "adapter": None if adapter is None else fingerprint(adapter),
            **({"adapters": {n: fingerprint(f) for n, f in adapters.items()}} if adapters else {}),
            "press_args": press_args,
            "dtype": dtype,
        },
    )
    if adapter is not None:
        folder = resolve_adapter(adapter, model)
        net, tokenizer, lookahead = load_lookahead(folder, model, dtype, attn_implementation, device)
    else:
        net, tokenizer = load_backbone(
            model, dtype=dtype, attn_implementation=attn_implementation, device=device
        )
    presses: dict[str, Press] = {}
    for name, path in adapters.items():  # LoRAs beside the first module's, on the same model
        host = lookahead.adapter.model
        method = f"{LOOKAHEAD_PREFIX}{name}"
        presses[method] = LookaheadKVPress.from_folder(
            resolve_adapter(path, model),
            host,
            adapter_name=f"lookahead_{name}".replace(".", "_"),
            **press_args.get(method, {}),
        )
    for method in methods:
        if method in presses:
            continue
        if method == "lookaheadkv":
            presses[method] = LookaheadKVPress(lookahead.adapter, **press_args.get(method, {}))
        elif method == "oracle":
            presses[method] = OraclePress()  # selection defaults only; its scores come from the FullKV answer
        else:
            presses[method] = make_method(method, **press_args.get(method, {}))
    start = time.perf_counter()
    evaluator = Evaluator(net, tokenizer, presses, budgets, settings, out, progress, streamed, batch_size)
    title = title or out.name
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
    report = write_report(rows, out, title=title, methods=methods)
    return f"lkv eval: {len(rows)} result rows in {out / RESULTS_FILE} ({seconds:.0f} s this run); report: {report}"


def interrupted_note(rows: int) -> str:
    """The report's warning that its cells are not all filled (the run stopped before its end)."""
    return (
        f"**Partial report**: the run was interrupted with {rows} rows in `{RESULTS_FILE}`, so some cells hold "
        "fewer samples than the config asks for (each cell gives its n). Rerun the same command to resume."
    )
