"""`lkv sweep`: a grid of `lkv fit` runs (+ cost and an optional `lkv eval` each), resumable, with a summary.

    lkv sweep --config configs/sweeps/lookahead_targets_smollm2.yaml                 # here, point by point
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml               # a SLURM job array
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml --summarize true   # once it ended

The grid runner is :mod:`lkv.sweep` (points, job arrays, summaries); this verb parses its arguments and runs
it. A grid over lookahead-module settings only (``num_lookahead``, ``lora_targets``, ``seed``, ...) can instead
be one fit with sibling modules on shared prefills (:class:`lkv.sweep.ablation.LookaheadAblation`).
"""

from __future__ import annotations

from typing import Any

from lkv.commands.signals import exit_on_sigterm
from lkv.sweep.run import run_sweep


def sweep(
    base: str,
    grid: dict[str, list[Any]],
    output: str = "runs/sweep",
    overrides: dict[str, Any] | None = None,
    eval_config: str | None = None,
    score: str = "val/recall@64",
    size_key: str = "model.num_lookahead",
    group_key: str = "model.lora_targets",
    overhead_tokens: int = 1024,
    overhead_repeats: int = 5,
    device: str | None = None,
    summary_dir: str | None = None,
    launcher: dict[str, Any] | None = None,
    summarize: bool = False,
    allow_partial: bool = False,
) -> str:
    """Run a grid of `lkv fit` (+ timing, + `lkv eval`) points; skip finished ones; write a summary.

    Args:
        base: the `lkv fit` config every point starts from (e.g. ``configs/smollm2_135m.yaml``).
        grid: dotted key → values, e.g. ``{model.num_lookahead: [4, 16], model.lora_targets: [none,
            all-linear]}``; ``eval.<arg>`` keys are `lkv eval` arguments (e.g. ``eval.budgets``).
        output: sweep folder (its layout: :mod:`lkv.sweep.run`); rerunning resumes it.
        overrides: dotted key → value applied to every point before its grid values (a reduced recipe,
            e.g. ``{trainer.max_steps: 64}``).
        eval_config: an `lkv eval` config run on every point's checkpoint (its ``lookaheadkv`` rows are
            kept); none: no eval.
        score: the metric of the ``group × size`` table and of the score plot (a logged ``val/...`` metric
            or an ``eval/...`` one).
        size_key, group_key: the grid keys of the plots' x axis and lines.
        overhead_tokens: prompt length of the lookahead-step vs prefill timing (0: no timing).
        overhead_repeats: timed repetitions (medians are reported).
        device: device of the timing and the eval (default: CPU); the fits use the config's trainer.
        summary_dir: where the summary, plots and per-point results go (default: ``output``), e.g. an
            ``experiments/`` folder that should not hold checkpoints.
        launcher: job resources of one point (:class:`lkv.sweep.launch.Launcher`: executor,
            nodes, gpus_per_node, tasks_per_node, cpus_per_task, mem_gb, timeout_min, partition,
            array_parallelism, slurm_args, setup, name, folder, wait): submit the unfinished points as a
            submitit job array and return; none (``--launcher null``): run them here, one after another.
        summarize: fit nothing; summarise the points' ``result.json`` files (after the jobs have ended).
        allow_partial: with ``summarize``, summarise the finished points even if some have no result
            (they are still listed); without it, missing points are an error.
    """
    with exit_on_sigterm():  # a pre-empted sweep also ends its running `lkv fit`/`lkv eval` child
        return run_sweep(
            base,
            grid,
            output,
            overrides,
            eval_config,
            score,
            size_key,
            group_key,
            overhead_tokens,
            overhead_repeats,
            device,
            summary_dir,
            launcher,
            summarize,
            allow_partial,
        )
