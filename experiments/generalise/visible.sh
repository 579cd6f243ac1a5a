#!/usr/bin/env bash
# Issue 56's "the visible reach sets do not drop beyond noise": the product recipe's two seeds (configs/visible/*.yaml
# -> results/visible/<set>, only the needles FullKV solved in each reach folder) pooled with experiments/reach's rows
# of the same needles (the sets of experiments/reach/pooled/pooled.sh: 155 far, 117 near, 51 1K), each seed paired
# by sample with the old long recipe of the same seed index:
#   vs_old_s0.md - reference lookaheadkv (the old recipe at C = 128: module seed 0 U the shared probe);
#   vs_old_scaled_s0.md - reference lookaheadkv:scaled (the old recipe at C = 256, the scaled sentence share);
#   vs_old_s1.md, vs_old_scaled_s1.md - the same for seed 1;
#   vs_oracle.md - both seeds against the Oracle (on the 129 far needles of the sets it was run with).
# Names: lookaheadkv:product(_s1) the product recipe (configs/general_smollm2.yaml, full_s0 / full_s1, preset long);
# the others as in experiments/reach/pooled/README.md.
# Run from anywhere: experiments/generalise/visible.sh (PYTHON defaults to python).
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python}
reach=experiments/reach
vis=experiments/generalise/results/visible
sets=("$reach/gold_probe_gold" "$reach/scaled_full=sc" "$reach/replica_3k" "$reach/scaled_3k=sc"
      "$reach/replica2_3k" "$reach/near2_3k" "$reach/fresh_5k")
mine=("$vis/full=product" "$vis/replica_3k=product" "$vis/replica2_3k=product" "$vis/near2_3k=product"
      "$vis/fresh_5k=product")
aliases=(lookaheadkv:scaled=lookaheadkv:sc lookaheadkv:scaled=lookaheadkv:scaled_s0
         lookaheadkv:scaled_s1=lookaheadkv:scaled_s1:sc lookaheadkv:product_s1=lookaheadkv:full_s1:product)
pool() { "$python" $reach/far_kinds.py "${sets[@]}" "${mine[@]}" --alias "${aliases[@]}" --budgets 128 256 "$@" > /dev/null; }

pool --reference lookaheadkv --out $vis/vs_old_s0.md --methods lookaheadkv lookaheadkv:product oracle
pool --reference lookaheadkv:scaled --out $vis/vs_old_scaled_s0.md --methods lookaheadkv:scaled lookaheadkv:product oracle
pool --reference lookaheadkv:union_s1 --out $vis/vs_old_s1.md --methods lookaheadkv:union_s1 lookaheadkv:product_s1 oracle
pool --reference lookaheadkv:scaled_s1 --out $vis/vs_old_scaled_s1.md \
  --methods lookaheadkv:scaled_s1 lookaheadkv:product_s1 oracle
pool --reference oracle --out $vis/vs_oracle.md --methods oracle lookaheadkv:product lookaheadkv:product_s1
