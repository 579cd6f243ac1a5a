#!/bin/bash
# Question-aware vs question-agnostic labels in the agnostic setting (README.md beside this file). Resumable:
# every step skips what is done (labels, adapter, result rows).
#   experiments/agnostic_labels/run.sh AWARE_ADAPTER > runs/agnostic_labels/run.log 2>&1
# AWARE_ADAPTER: the adapter of `make demo` (reports/demo/adapter), trained on the same 64 prompts.
set -e
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=${PYTHON:-.venv/bin/python}
AWARE=${1:?usage: run.sh AWARE_ADAPTER}
HERE=experiments/agnostic_labels
RUNS=runs/agnostic_labels
# labels, fit and export as `make demo` does them, with agnostic labels; its eval is this suite's agnostic half
/usr/bin/time -f "agnostic demo: %e s wall" "$PY" -m lkv.cli demo --config configs/demo/smollm2_135m.yaml \
  --label_mode agnostic --labels "$RUNS/labels" --output "$RUNS/demo" --trace_tokens 0 --progress false \
  --eval_config "$HERE/eval.yaml"
/usr/bin/time -f "aware adapter eval: %e s wall" "$PY" -m lkv.cli eval --config "$HERE/eval.yaml" --methods "[lookaheadkv]" \
  --adapter "$AWARE" --output "$RUNS/aware" --progress false
"$PY" "$HERE/compare.py"
