"""CPU seconds of one training step (forward + backward, no optimiser step) of the module alone, the probe alone
and both in one LightningModule, on the embedded model, in one process: what a joint fit saves per step, without
the process start-up and model load that the fit-level bench (scripts/bench_joint_fit.py) also counts.

    OMP_NUM_THREADS=1 python experiments/joint_fit/step_cpu.py > experiments/joint_fit/step_cpu.json

A 1000-token random prompt with random labels, configs/long_smollm2.yaml's module and probe (M = 16, LoRA r = 8 on
all linears; MLP 576 -> 512 -> 3 per layer); 5 rounds of the three steps in turn, the first dropped as warm-up;
the median CPU seconds (``time.process_time``) per kind.
"""

import json
import statistics
import time
import warnings

import torch

from lkv.train.module import LookaheadKVModule
from lkv.train.probe_head import ProbeSettings
from lkv.train.probe_module import ProbeModule

LENGTH, ROUNDS = 1000, 5


def main() -> None:
    warnings.simplefilter("ignore")  # self.log() without a Trainer warns and does nothing
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30000, (LENGTH,), generator=generator)
    scores = torch.softmax(torch.randn(30, 3, LENGTH, generator=generator), -1)
    sample = {"id": "bench", "prompt_ids": ids, "response_ids": ids[:0], "scores": scores}
    modules = {
        "module": LookaheadKVModule(num_lookahead=16),
        "probe": ProbeModule(),
        "joint": LookaheadKVModule(num_lookahead=16, probe=ProbeSettings()),
    }
    seconds: dict[str, list[float]] = {kind: [] for kind in modules}
    for module in modules.values():
        module.configure_model()
        module.train()
    for _ in range(ROUNDS):
        for kind, module in modules.items():
            start = time.process_time()
            module.training_step([sample], 0).backward()
            seconds[kind].append(time.process_time() - start)
            for param in module.trainable_parameters().values():
                param.grad = None
    median = {kind: statistics.median(values[1:]) for kind, values in seconds.items()}
    ratio = median["joint"] / (median["module"] + median["probe"])
    print(
        json.dumps(
            {"prompt_tokens": LENGTH, "cpu_s": seconds, "median_cpu_s": median, "joint_over_two": ratio}
        )
    )


if __name__ == "__main__":
    main()
