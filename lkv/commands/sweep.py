"""`lkv sweep`: a grid of `lkv fit` runs (+ cost and an optional `lkv eval` each), resumable, with a summary.

    lkv sweep --config configs/sweeps/lookahead_targets_smollm2.yaml                 # here, point by point
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml               # a SLURM job array
    lkv sweep --config configs/sweeps/lookahead_targets_llama3_8b.yaml --summarize true   # once it ended

The verb is :func:`lkv.sweep.run.run_sweep` (its signature: the options; the stage: :mod:`lkv.sweep`). A grid
over lookahead-module settings only (``num_lookahead``, ``lora_targets``, ``seed``, ...) can instead be one
fit with sibling modules on shared prefills (:class:`lkv.sweep.ablation.LookaheadAblation`).
"""

from __future__ import annotations

from lkv.commands.signals import exit_on_sigterm
from lkv.sweep.run import run_sweep

# The verb is the runner itself (its signature and docstring are the options and their help), with SIGTERM
# (a scheduler's pre-emption) turned into SystemExit, which also ends the running `lkv fit`/`lkv eval` child.
sweep = exit_on_sigterm()(run_sweep)
