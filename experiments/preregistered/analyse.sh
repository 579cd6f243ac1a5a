#!/usr/bin/env bash
# The analysis experiments/preregistered/PLAN.md fixes, on the evaluation's folder once it is complete:
#   experiments/preregistered/analyse.sh
# writes into experiments/preregistered/results/:
#   summary.md - analysis 1 and 2: per method, budget and cell, kept / FullKV-solved with Wilson 95 %, by source
#                group x bin, source, kind side, kind, bin and distance band (each method paired with the Oracle);
#                then analysis 3, per seed and never pooled: `long` against the Oracle, `pooled`, `paper`, the
#                probe and each training-free method, and the two seeds' `long` against each other (exact
#                McNemar, 95 % interval of the paired difference);
#   targets.md - the targets, per seed, met or missed (targets.py).
# Method names (configs/eval.yaml): seed 0 lookaheadkv (long), lookaheadkv:pooled_s0, lookaheadkv:paper_s0, probe;
# seed 1 lookaheadkv:s1 (long), lookaheadkv:pooled_s1, lookaheadkv:paper_s1, probe:s1.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python}
here=experiments/preregistered
out=${RESULTS:-$here/results}   # RESULTS: another folder holding eval/ (the tests)
free=(snapkv pyramidkv keydiff expected_attention)
pairs=()
for m in oracle lookaheadkv:pooled_s0 lookaheadkv:paper_s0 probe "${free[@]}"; do pairs+=(--pair "lookaheadkv=$m"); done
for m in oracle lookaheadkv:pooled_s1 lookaheadkv:paper_s1 probe:s1 "${free[@]}"; do
  pairs+=(--pair "lookaheadkv:s1=$m")
done
pairs+=(--pair lookaheadkv=lookaheadkv:s1)
"$python" experiments/generalise/summary.py "$out/eval" --reference oracle "${pairs[@]}" > "$out/summary.md"
"$python" $here/targets.py "$out/eval" \
  --seed 0=lookaheadkv,lookaheadkv:pooled_s0 --seed 1=lookaheadkv:s1,lookaheadkv:pooled_s1 > "$out/targets.md"
