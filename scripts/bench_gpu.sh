#!/usr/bin/env bash
# GPU cost benchmarks (`lkv bench`, all five sub-benchmarks in one process) on a randomly initialised model of
# a real architecture: timings and memory do not depend on weight values, so no weights are needed.
#
#   scripts/bench_gpu.sh                      # Llama-3.1-8B config, bf16, CUDA; about 5 min on one H200
#   ARCH=qwen3-8b scripts/bench_gpu.sh        # any name of lkv.perf.models.ARCHITECTURES
#   DRY_RUN=1 scripts/bench_gpu.sh            # the same script on the CPU with tiny sizes (1–2 min)
#
# Sizes (GPU): ttft at 8K/16K/32K, decode at 8K/32K, train-step at 2K/4K/8K (the eager naive step up to 4K;
# a variant that does not fit is reported as "out of memory"), label at 8K/16K with 128-token responses,
# prefill-memory (two-phase vs layer-streamed LookaheadKV) at 8K/32K;
# budget 1024; 3 repetitions after 1 warm-up. Then labelling throughput at batch 1 vs 8 (8 prompts of
# 12K–16K tokens, R = 512, one repetition: ≈ 4 min more). Output in $OUT (default runs/bench/gpu):
# bench.json (raw times, medians, ratios, environment), bench.md (the tables), label-batches.json and
# label-batches.md, env.txt (GPU and package versions).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/bench/gpu}
ARCH=${ARCH:-llama-3.1-8b}
if [[ -n "${DRY_RUN:-}" ]]; then
  ARCH=tiny-llama DEVICE=cpu DTYPE=float32
  LENGTHS='{"ttft": [256, 512], "decode": [256, 512], "train-step": [128, 256], "label": [256, 512], "prefill-memory": [256, 512]}'
  EXTRA=(--budget 64 --num_lookahead 8 --draft_tokens 4 --response_tokens 8 --decode_tokens 4
         --repeats 1 --warmup 1 --threads 1)
  BATCHES=(--lengths [512] --response_tokens 8 --threads 1)
else
  DEVICE=cuda DTYPE=bfloat16
  LENGTHS='{"ttft": [8192, 16384, 32768], "decode": [8192, 32768], "train-step": [2048, 4096, 8192], "label": [8192, 16384], "prefill-memory": [8192, 32768]}'
  EXTRA=(--budget 1024 --response_tokens 128 --decode_tokens 32 --repeats 3 --warmup 1 --eager_max_length 4096)
  BATCHES=(--lengths [16384] --response_tokens 512)
fi

PYTHON=${PYTHON:-python3}
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; fi
# Run from the source tree: no installation needed, only the dependencies.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

"$PYTHON" - "$DEVICE" <<'EOF' | tee "$OUT/env.txt"
import importlib.metadata as md
import importlib.util
import sys

needed = ["torch", "transformers", "peft", "lightning", "torchmetrics", "jsonargparse", "safetensors"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"bench_gpu.sh: missing Python packages {missing}; install lkv's dependencies (pip install -e .)")
if int(md.version("transformers").split(".")[0]) < 5:
    sys.exit(f"bench_gpu.sh: lkv needs transformers 5, found {md.version('transformers')}")
import torch

if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("bench_gpu.sh: no CUDA device visible (DRY_RUN=1 runs on the CPU)")
print("python", sys.version.split()[0], *(f"{name} {md.version(name)}" for name in needed))
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
EOF

"$PYTHON" -m lkv.cli bench --which all --model "random:$ARCH" --dtype "$DTYPE" --device "$DEVICE" \
  --lengths "$LENGTHS" "${EXTRA[@]}" --json_out "$OUT/bench.json" | tee "$OUT/bench.md"

"$PYTHON" -m lkv.cli bench --which label --model "random:$ARCH" --dtype "$DTYPE" --device "$DEVICE" \
  --batch_sizes [1,8] --label_prompts 8 --repeats 1 --warmup 0 "${BATCHES[@]}" \
  --json_out "$OUT/label-batches.json" | tee "$OUT/label-batches.md"
