#!/usr/bin/env bash
# The paper-scale pipeline on ONE GPU with no hub: randomly initialised models of real shapes (Llama-3.1-8B and
# Qwen3-1.7B in bf16), saved locally with tokenizers built in code (Llama 3's and Qwen3's chat formats), taken
# through every stage the recipes use:
#
#   Llama: label (--batch_size 8: two training sources, responses only, and held-out prompts) → fit
#   (configs/llama3_8b.yaml + an overlay: the two folders as a weighted mix, validation on the held-out folder
#   with online ground truth, accumulation, checkpoints) → resume (--ckpt_path last) → eval (importance on the
#   held-out folder + a 16K needle task at --batch_size 8: FullKV, SnapKV, LookaheadKV)
#   Qwen3: label (--batch_size 8, with scores; the template's thinking switch off) → eval (importance + the 16K
#   needle task at --batch_size 8: FullKV, SnapKV, Oracle)
#   bench (TTFT at 8K and 16K)
#
#   scripts/smoke_gpu.sh              # one GPU, bf16, prompts up to 16K, R = 512; planned ≤ 7 min on an H200
#   DRY_RUN=1 scripts/smoke_gpu.sh    # the same commands on the CPU with tiny models (tests run it)
#
# Every stage's wall time and peak memory is printed as it ends and collected in $OUT/summary.md (default
# runs/smoke/gpu, runs/smoke/dry with DRY_RUN), with the checks the run must pass (the Qwen3 labels end with the
# empty think block; each eval stage held at most B + 1 full caches, docs/scale_out.md): stages.jsonl (seconds
# and peak memory: CUDA max_memory_allocated on a GPU, peak RSS on the CPU), step_times.json (seconds per
# optimiser step), ttft.json (the `lkv bench` record), summary.md / summary.json (all of it), plus the models,
# prompts, labels, checkpoints, TensorBoard logs and eval reports. Starts from scratch each run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${DRY_RUN:-}" ]]; then
  OUT=${OUT:-runs/smoke/dry}
  ARCH=tiny-llama QWEN=tiny-qwen3 DTYPE=float32 DEVICE=cpu ACCEL=cpu PRECISION=32-true
  TRAIN_A=(96 128 160 192 224 256) TRAIN_B=(128 192 256) HELDOUT=(200 256) QWEN_PROMPTS=(128 192 256)
  MAX_PROMPT=256 RESPONSE=8 QWEN_RESPONSE=8 NEEDLE=200 ESSAY_TOKENS=400 NEEDLE_TOKENS=4
  BUDGETS="[32, 64]" TTFT_LENGTHS="[256, 512]"
  BENCH=(--budget 64 --num_lookahead 8 --draft_tokens 4 --repeats 1 --warmup 0 --threads 1)
else
  OUT=${OUT:-runs/smoke/gpu}
  ARCH=llama-3.1-8b QWEN=qwen3-1.7b DTYPE=bfloat16 DEVICE=cuda ACCEL=gpu PRECISION=bf16-mixed
  TRAIN_A=(2048 4096 8192 12288 16384 16384) TRAIN_B=(4096 8192 16384) HELDOUT=(8192 16384)
  QWEN_PROMPTS=(4096 8192 16384) MAX_PROMPT=16384 RESPONSE=512 QWEN_RESPONSE=128 NEEDLE=16384
  ESSAY_TOKENS=12000 NEEDLE_TOKENS=16
  BUDGETS="[64, 256, 1024]" TTFT_LENGTHS="[8192, 16384]"
  BENCH=(--budget 1024 --repeats 2 --warmup 1)
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

stage model-llama smoke model --out "$OUT/llama" --arch "$ARCH" --chat llama3 --dtype "$DTYPE" --device "$DEVICE"
stage model-qwen smoke model --out "$OUT/qwen" --arch "$QWEN" --chat qwen3 --dtype "$DTYPE" --device "$DEVICE"
"$PYTHON" -m lkv.perf.smoke prompts --model "$OUT/llama" --out "$OUT/prompts-train-a.jsonl" --lengths "${TRAIN_A[@]}" --seed 1
"$PYTHON" -m lkv.perf.smoke prompts --model "$OUT/llama" --out "$OUT/prompts-train-b.jsonl" --lengths "${TRAIN_B[@]}" --seed 3
"$PYTHON" -m lkv.perf.smoke prompts --model "$OUT/llama" --out "$OUT/prompts-heldout.jsonl" --lengths "${HELDOUT[@]}" --seed 2
"$PYTHON" -m lkv.perf.smoke prompts --model "$OUT/qwen" --out "$OUT/prompts-qwen.jsonl" --lengths "${QWEN_PROMPTS[@]}" --seed 4
"$PYTHON" -m lkv.perf.smoke essays --model "$OUT/llama" --out "$OUT/essays" --docs 4 --tokens "$ESSAY_TOKENS"

# The labelling commands of the paper configs' headers (--batch_size 8), on the local models and prompt files.
label() {
  local model=$1 response=$2
  shift 2
  stage "$1" label --model "$OUT/$model" --dtype "$DTYPE" --accelerator "$ACCEL" --devices 1 --batch_size 8 \
    --response_tokens "$response" --max_prompt_tokens "$MAX_PROMPT" --truncation middle --progress false \
    --prompts.class_path lkv.labels.dataset_prompts.JsonlPrompts --prompts.init_args.id_field id \
    --output "$OUT/labels/${1#label-}" --prompts.init_args.path "$OUT/prompts-${1#label-}.jsonl" "${@:2}"
}
label llama "$RESPONSE" label-train-a --store_scores false
label llama "$RESPONSE" label-train-b --store_scores false
# held-out responses only: validation and `lkv eval` compute the ground truth online from the prefill
label llama "$RESPONSE" label-heldout --store_scores false
# Qwen3 with stored float32 scores (each row's prompt cache cut out of the batch to teacher-force it)
label qwen "$QWEN_RESPONSE" label-qwen --store_scores true --score_dtype float32

# 4 optimiser steps of 2 accumulated micro-batches from the two training folders (weights 2 : 1), validation
# after step 2 and 4, checkpoints every 2 steps; the resume goes on to step 6 from last.ckpt.
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
  model: $OUT/llama
  dtype: $DTYPE
  optim:
    warmup_steps: 1
  eval_budgets: $BUDGETS
data:
  train: [$OUT/labels/train-a, $OUT/labels/train-b]
  weights: [2.0, 1.0]
  val: $OUT/labels/heldout
EOF
}
overlay 4 > "$OUT/overlay.yaml"
overlay 6 > "$OUT/overlay-resume.yaml"
stage fit fit --config configs/llama3_8b.yaml --config "$OUT/overlay.yaml"
stage fit-resume fit --config configs/llama3_8b.yaml --config "$OUT/overlay-resume.yaml" --ckpt_path last

# 8 needles in NEEDLE-token haystacks (one chunk of 8 at --batch_size 8) + importance on the labels
tasks() {
  echo "[{class_path: lkv.eval.tasks.ImportanceTask, init_args: {folder: $1, budgets: $BUDGETS}},
    {class_path: lkv.eval.tasks.NeedleTask, init_args: {lengths: [$NEEDLE], depths: [0.25, 0.75], samples_per_cell: 4,
     max_new_tokens: $NEEDLE_TOKENS, essays_dir: $OUT/essays, heldout_fraction: 1.0}}]"
}
EVAL=(--dtype "$DTYPE" --device "$DEVICE" --budgets "$BUDGETS" --settings '[aware]' --batch_size 8 --progress false)
stage eval-llama eval --model "$OUT/llama" --adapter "$OUT/checkpoints/last.ckpt" "${EVAL[@]}" \
  --methods '[fullkv, lookaheadkv, snapkv]' --output "$OUT/eval-llama" --tasks "$(tasks "$OUT/labels/heldout")"
stage eval-qwen eval --model "$OUT/qwen" "${EVAL[@]}" \
  --methods '[fullkv, snapkv, oracle]' --output "$OUT/eval-qwen" --tasks "$(tasks "$OUT/labels/qwen")"

stage bench-ttft bench --which ttft --model "random:$ARCH" --dtype "$DTYPE" --device "$DEVICE" \
  --lengths "$TTFT_LENGTHS" "${BENCH[@]}" --json_out "$OUT/ttft.json"

"$PYTHON" -m lkv.perf.smoke summary --out "$OUT" --thinking-labels "$OUT/labels/qwen"
echo "smoke: done in ${SECONDS} s wall (stages above, plus writing prompts and essays)"
