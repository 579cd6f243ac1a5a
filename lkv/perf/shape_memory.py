"""Peak tensor memory of the training step at real shapes, without doing its arithmetic.

``lkv bench --which train-memory`` answers "does the paper's step fit on the GPU?" on any machine: it runs
the real two-phase step (:meth:`lkv.module.LookaheadKVModule.training_step` + backward) of a randomly
initialised model with only a few decoder layers, with every tensor made inside the step a *fake* tensor
(``torch._subclasses.FakeTensorMode``: shape, dtype and device, no data, no arithmetic), and counts the
bytes of the tensor storages alive at each moment (:class:`LiveTensorBytes`). Every operator still runs
through PyTorch's dispatcher with its real output shapes, so the count is what a caching allocator's
``max_memory_allocated`` sees, minus its rounding and fragmentation. Why not measure it for real: a 16K
step of an 8B-shaped model is ~30 TFLOP, and this project's CPUs (AVX2, no bf16 instructions) run bf16
matrix products at < 0.1 GFLOP/s.

Measured at 1 and 2 decoder layers, the difference is what one layer adds (its share of the KV cache,
what its lookahead pass keeps for backward, its LoRA gradients); the rest is the depth-independent part
(the prompt's hidden states and the largest layer's transient activations, the loss). A full-depth step
is then ``constant + layers × per_layer``, and a GPU also holds the frozen weights and the optimiser.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoModelForCausalLM, PreTrainedModel

from lkv.perf.suites.train_step import TrainStep

MIB = 2**20
GIB = 2**30


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storages created inside it and alive at the same time; keeps the peak.

    A storage is counted once, when an operator first returns a tensor on it (views and in-place results
    share it), and released when Python frees it. Storages passed to :meth:`ignore` (the weights, which
    exist before and after) are never counted, not even when an operator first returns a view of them.

    Attributes:
        current: bytes alive now; peak: the most bytes alive at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._alive: dict[int, weakref.ref] = {}
        self._ignored: list[torch.UntypedStorage] = []  # strong references: their ids stay theirs

    def ignore(self, tensors: list[torch.Tensor]) -> None:
        """Never count the storages of ``tensors``."""
        self._ignored.extend(t.untyped_storage() for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 — torch's hook
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if (key in self._alive and self._alive[key]() is storage) or any(s is storage for s in self._ignored):
            return
        size = storage.nbytes()
        self._alive[key] = weakref.ref(storage, lambda _, key=key, size=size: self._release(key, size))
        self.current += size
        self.peak = max(self.peak, self.current)

    def _release(self, key: int, size: int) -> None:
        self._alive.pop(key, None)
        self.current -= size


def step_peak_bytes(bench: Any, length: int) -> int:
    """Peak bytes alive during one two-phase training step of ``bench`` (a :class:`lkv.perf.workbench.Workbench`).

    The model and the lookahead module are real (built before); the prompt, the labels and everything the
    step makes are fake, so the step costs no arithmetic.
    """
    module = bench.training_module  # built with real (small) weights, outside the fake mode
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = LiveTensorBytes()
    # the fake twins the mode will use for the weights (it memoises them): weights are not the step's memory
    tracker.ignore([fake_mode.from_tensor(t) for t in (*module.parameters(), *module.buffers())])
    with fake_mode:
        case = TrainStep().case(bench, "two-phase", length)
        case.reset()
        with tracker:
            case.run()
        case.reset()
    return tracker.peak


LAYER_COUNTS = (1, 2)
ADAM_STATES = 2  # exp_avg and exp_avg_sq, fp32 like the trainable weights


def measure(
    settings: Any, lengths: list[int], workbench: Callable[[PreTrainedModel], Any], gpu_gib: float = 80.0
) -> dict[str, Any]:
    """Peak step memory at 1 and 2 decoder layers per prompt length, and the full-depth per-GPU estimate.

    Args:
        settings: a :class:`lkv.perf.workbench.BenchSettings` whose ``model`` is ``random:<architecture>``.
        lengths: prompt lengths S in tokens.
        workbench: builds the :class:`lkv.perf.workbench.Workbench` that runs the step on a given model (with
            the lookahead module injected into that model itself: a copy of an 8B-wide model costs GiBs).
        gpu_gib: memory of one GPU, for the headroom column.

    Returns:
        ``{"settings", "architecture", "layers", "weights_bytes", "trainable_params", "optimizer_bytes",
        "lengths": {S: {"peak_bytes": {layers: bytes}, "per_layer_bytes", "step_bytes", "total_bytes",
        "headroom_bytes"}}}``, where ``step_bytes = peak(1) + (L − 1)·per_layer`` and ``total_bytes`` adds
        the frozen weights, the fp32 trainable weights and Adam's two states (their gradients are in the
        step).
    """
    from lkv.model.backbone import DTYPES
    from lkv.perf.models import RANDOM_PREFIX, architecture_config, random_model

    if not settings.model.startswith(RANDOM_PREFIX):
        raise ValueError(
            f"train-memory cuts a named architecture to {LAYER_COUNTS} layers: --model must be "
            f"random:<architecture>, got {settings.model!r}"
        )
    architecture = settings.model[len(RANDOM_PREFIX) :]
    dtype = DTYPES[settings.dtype]
    full = architecture_config(architecture)
    with torch.device("meta"):  # shapes only: count the full model's weights without allocating them
        weights = sum(
            p.numel() * p.element_size()
            for p in AutoModelForCausalLM.from_config(full, dtype=dtype).parameters()
        )
    peaks: dict[int, dict[int, int]] = {n: {} for n in lengths}
    trainable: dict[int, int] = {}
    for layers in LAYER_COUNTS:
        model = random_model(architecture, dtype, "cpu", settings.attn_implementation, settings.seed, layers)
        bench = workbench(model)
        trainable[layers] = sum(p.numel() for p in bench.lookahead.trainable_parameters().values())
        for length in lengths:
            peaks[length][layers] = step_peak_bytes(bench, length)
        del bench, model
        gc.collect()  # the next depth's weights must not sit beside these (an 8B-wide layer stack is GiBs)
    depth = full.num_hidden_layers
    params = trainable[1] + (depth - 1) * (trainable[2] - trainable[1])
    optimizer = params * 4 * (1 + ADAM_STATES)
    out: dict[str, Any] = {
        "architecture": architecture,
        "dtype": settings.dtype,
        "layers": depth,
        "weights_bytes": weights,
        "trainable_params": params,
        "optimizer_bytes": optimizer,
        "gpu_gib": gpu_gib,
        "lengths": {},
    }
    for length, peak in peaks.items():
        per_layer = peak[2] - peak[1]
        step = peak[1] + (depth - 1) * per_layer
        total = weights + optimizer + step
        out["lengths"][str(length)] = {
            "peak_bytes": {str(k): v for k, v in peak.items()},
            "per_layer_bytes": per_layer,
            "step_bytes": step,
            "total_bytes": total,
            "headroom_bytes": gpu_gib * GIB - total,
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    """The per-GPU memory table of :func:`measure`."""
    depth, gpu = result["layers"], result["gpu_gib"]
    head = [
        "S",
        "step, 1 layer MiB",
        "step, 2 layers MiB",
        "per layer MiB",
        f"step, {depth} layers GiB",
        "frozen weights GiB",
        "trainable + Adam GiB",
        "per GPU GiB",
        f"left of {gpu:g} GiB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for length, r in result["lengths"].items():
        row = [
            length,
            f"{r['peak_bytes']['1'] / MIB:.0f}",
            f"{r['peak_bytes']['2'] / MIB:.0f}",
            f"{r['per_layer_bytes'] / MIB:.1f}",
            f"{r['step_bytes'] / GIB:.2f}",
            f"{result['weights_bytes'] / GIB:.2f}",
            f"{result['optimizer_bytes'] / GIB:.2f}",
            f"{r['total_bytes'] / GIB:.2f}",
            f"{r['headroom_bytes'] / GIB:.1f}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        f"\n{result['architecture']} ({result['dtype']}), {result['trainable_params'] / 1e6:.1f} M trainable "
        "parameters; step = peak of the 1-layer step + (layers − 1) × per layer (tensor bytes alive, fake "
        "tensors: lkv/perf/shape_memory.py)"
    )
    return "\n".join(lines)
