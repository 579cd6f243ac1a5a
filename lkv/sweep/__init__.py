"""Grids of lookahead-module trainings and their summaries: the stage above training that runs many of them.

Two runners share the grid's points (:mod:`~lkv.sweep.grid`: a point is a dict of setting → value, named
``num_lookahead=4,lora_targets=q_proj+v_proj``) and its summary table and plots:

- ``lkv sweep`` (:mod:`~lkv.sweep.run`): one ``lkv fit`` per point, each in its own process, then the
  point's cost (:mod:`lkv.perf.overhead`) and an optional ``lkv eval`` (:mod:`~lkv.sweep.points`), here one
  after another or as a submitit job array (:mod:`~lkv.sweep.launch`), resumable, summarised with an
  HParams session per point (:mod:`~lkv.sweep.summary`). Any config key may vary: data, optimiser, trainer,
  model, ``eval.`` arguments.
- :class:`~lkv.sweep.ablation.LookaheadAblation`, a callback of ONE ``lkv fit``: sibling lookahead modules
  trained on the main module's shared prefills. Only lookahead-module settings may vary
  (:data:`~lkv.sweep.ablation.ABLATION_KEYS`: ``num_lookahead``, LoRA settings, ``lookahead_init``, ``seed``,
  ``max_position_offset``, the top-C loss); the data, optimiser and trainer are the main module's.

Which to use: a grid over module settings only → the ablation callback (the frozen prefill, most of a step,
is paid once for all points); a grid that changes the data, optimiser, schedule, trainer or base model, or
that needs one ``lkv eval`` per point or several GPUs per point → ``lkv sweep``.
"""
