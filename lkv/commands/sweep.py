"""`lkv sweep`: a grid of `lkv fit` runs (+ cost and an optional `lkv eval` each), resumable, with a summary.

    lkv sweep --config configs/sweeps/lookahead_targets_smollm2.yaml                 # here, point by point
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml               # a SLURM job array
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml --summarize true   # once it ended

The signature's types are light; the run (:func:`lkv.sweep.run.run_sweep`: the stage is :mod:`lkv.sweep`) and
with it Lightning, submitit and matplotlib are imported once the options parsed, so `lkv sweep --help` and an
option error answer at once. A grid over lookahead-module settings only (``num_lookahead``, ``lora_targets``,
``seed``, ...) can instead be one fit with sibling modules on shared prefills
(:class:`lkv.sweep.ablation.LookaheadAblation`).
"""

from __future__ import annotations

from typing import Any

from lkv.commands.signals import exit_on_sigterm


# SIGTERM (a scheduler's pre-emption) turned into SystemExit, which also ends the running `lkv fit` or
# `lkv eval` child
@exit_on_sigterm()
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

    The points run here one after another, or as a submitit job array (``launcher``). Returns the line
    `lkv sweep` prints.

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

    Raises:
        FileNotFoundError: the base or eval config is missing, or (``summarize``) points have no result.
        ValueError: ``eval.`` grid keys without an ``eval_config``, or a bad ``launcher`` field.
    """
    options = dict(locals())
    # imported here, not at the top: the signature and this docstring are `lkv sweep --help`, which then answers
    # without loading torch, Lightning, submitit or matplotlib
    from lkv.sweep.run import run_sweep

    return run_sweep(**options)
