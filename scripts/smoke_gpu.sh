#!/usr/bin/env bash
# The paper-scale pipeline on ONE GPU with no hub: a randomly initialised Llama-3.1-8B-shaped model in bf16,
# saved locally with a tokenizer built in code, taken through every stage the recipe uses:
#
#   label (train: responses only; held-out: with scores) → fit (configs/llama3_8b.yaml + an overlay: a few
#   steps, accumulation, validation, checkpoints) → resume (--ckpt_path last) → eval (importance on the
#   held-out labels) → bench (TTFT at 8K and 16K)
#
#   scripts/smoke_gpu.sh              # one GPU, bf16, prompts up to 16K, R = 512; budget ≤ 8 min on an H200
#   DRY_RUN=1 scripts/smoke_gpu.sh    # the same commands on the CPU with a tiny model (≈ 2 min; tests run it)
#
# Output in $OUT (default runs/smoke/gpu, runs/smoke/dry with DRY_RUN): stages.jsonl (seconds and peak
# memory of each stage: CUDA max_memory_allocated on a GPU, peak RSS on the CPU), step_times.json (seconds
# per optimiser step), ttft.json (the `lkv bench` record), summary.md / summary.json (all of it), plus the
# model, prompts, labels, checkpoints, TensorBoard logs and the eval report. Starts from scratch each run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${DRY_RUN:-}" ]]; then
  OUT=${OUT:-runs/smoke/dry}
  ARCH=tiny-llama DTYPE=float32 DEVICE=cpu ACCEL=cpu PRECISION=32-true
  TRAIN_LENGTHS=(96 128 160 192 224 256) HELDOUT_LENGTHS=(200 256) MAX_PROMPT=256 RESPONSE=8
  BUDGETS="[16, 32]" TTFT_LENGTHS="[256, 512]"
  BENCH=(--budget 64 --num_lookahead 8 --draft_tokens 4 --repeats 1 --warmup 0 --threads 1)
else
  OUT=${OUT:-runs/smoke/gpu}
  ARCH=llama-3.1-8b DTYPE=bfloat16 DEVICE=cuda ACCEL=gpu PRECISION=bf16-mixed
  TRAIN_LENGTHS=(2048 4096 8192 12288 16384 16384) HELDOUT_LENGTHS=(8192 16384) MAX_PROMPT=16384 RESPONSE=512
  BUDGETS="[64, 256, 1024]" TTFT_LENGTHS="[8192, 16384]"
  BENCH=(--budget 1024 --repeats 3 --warmup 1)
fi

PYTHON=${PYTHON:-python3}
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ -z "${DRY_RUN:-}" ]]; then
  "$PYTHON" -c 'import sys, torch; torch.cuda.is_available() or sys.exit("smoke_gpu.sh: no CUDA device (DRY_RUN=1 runs on the CPU)")'
fi
rm -rf "$OUT"
mkdir -p "$OUT"
stage() { "$PYTHON" scripts/smoke_stage.py --out "$OUT" "$1" -- "${@:2}"; }

"$PYTHON" -m lkv.perf.smoke assets --out "$OUT" --arch "$ARCH" --dtype "$DTYPE" --device "$DEVICE" \
  --train-lengths "${TRAIN_LENGTHS[@]}" --heldout-lengths "${HELDOUT_LENGTHS[@]}"

# The labelling commands of configs/llama3_8b.yaml's header, on the local model and prompt files.
LABEL=(--model "$OUT/model" --dtype "$DTYPE" --accelerator "$ACCEL" --devices 1 --response_tokens "$RESPONSE"
       --max_prompt_tokens "$MAX_PROMPT" --truncation middle --progress false
       --prompts.class_path lkv.labels.dataset_prompts.JsonlPrompts --prompts.init_args.id_field id)
stage label-train label "${LABEL[@]}" --output "$OUT/labels/train" \
  --prompts.init_args.path "$OUT/prompts-train.jsonl" --store_scores false
# held-out WITH scores (float32): validation and `lkv eval` read the ground truth from disk
stage label-heldout label "${LABEL[@]}" --output "$OUT/labels/heldout" \
  --prompts.init_args.path "$OUT/prompts-heldout.jsonl" --store_scores true --score_dtype float32

# 4 optimiser steps of 2 accumulated micro-batches, validation after step 2 and 4, checkpoints every 2 steps;
# the resume goes on to step 6 from last.ckpt.
overlay() {
  cat <<EOF
trainer:
  accelerator: $ACCEL
  devices: 1
  strategy: auto
  precision: $PRECISION
  max_steps: $1
  accumulate_grad_batches: 2
  val_check_interval: 4
  limit_val_batches: 2
  log_every_n_steps: 1
  enable_progress_bar: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: $OUT/runs, name: smoke}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: $OUT/checkpoints, every_n_train_steps: 2, save_top_k: -1, save_last: true}
    - class_path: lkv.perf.smoke.StepTimes
      init_args: {path: $OUT/step_times.json}
model:
  model: $OUT/model
  dtype: $DTYPE
  warmup_steps: 1
  eval_budgets: $BUDGETS
data:
  train: $OUT/labels/train
  val: $OUT/labels/heldout
EOF
}
overlay 4 > "$OUT/overlay.yaml"
overlay 6 > "$OUT/overlay-resume.yaml"
stage fit fit --config configs/llama3_8b.yaml --config "$OUT/overlay.yaml"
stage fit-resume fit --config configs/llama3_8b.yaml --config "$OUT/overlay-resume.yaml" --ckpt_path last

stage eval eval --model "$OUT/model" --dtype "$DTYPE" --device "$DEVICE" --adapter "$OUT/checkpoints/last.ckpt" \
  --methods '[lookaheadkv, snapkv]' --budgets "$BUDGETS" --settings '[aware]' --output "$OUT/eval" \
  --progress false --tasks "[{class_path: lkv.eval.tasks.ImportanceTask, init_args: {folder: $OUT/labels/heldout, budgets: $BUDGETS}}]"

stage bench-ttft bench --which ttft --model "random:$ARCH" --dtype "$DTYPE" --device "$DEVICE" \
  --lengths "$TTFT_LENGTHS" "${BENCH[@]}" --json_out "$OUT/ttft.json"

"$PYTHON" -m lkv.perf.smoke summary --out "$OUT"
