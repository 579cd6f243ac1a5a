#!/usr/bin/env bash
# Issue 52 item 6, the copy-boost lever (configs/copy_s0.yaml, copy_s1.yaml: one fit per seed, the recipe's
# module and two siblings trained with model.copy_boost 0.2 / 0.5, each with the fit's own probe, preset long),
# measured on the visible reach sets only (configs/visible/*.yaml's needles, only those FullKV solved there),
# never on the pre-registered ones. Every module of both seeds scores the same prefill of each needle.
#
#   experiments/generalise/copy_lever.sh run 1/2     # and `run 2/2` beside it: one thread each, resumable
#   experiments/generalise/copy_lever.sh report      # -> results/copy/copy_s0.md, copy_s1.md
#
# Names: lookaheadkv is seed 0's main module (copy_boost 0, the recipe), lookaheadkv:copy20_s0 / copy50_s0 its
# siblings; lookaheadkv:base_s1, copy20_s1, copy50_s1 seed 1's. Each report pairs a seed's siblings with its own
# main module by sample (exact McNemar), far / near / 1K needles, C = 128 and 256.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python}
lkv=${LKV:-lkv}
here=experiments/generalise
out=$here/results/copy
sets=(full replica_3k replica2_3k fresh_5k near2_3k)  # far needles first: a run cut short holds them
points() { echo "runs/copy_s$1/ablation/adapters/copy_boost=$2"; }
case "${1:-}" in
  run)
    shard=${2:?usage: copy_lever.sh run K/N}
    adapters="{copy20_s0: $(points 0 0.2), copy50_s0: $(points 0 0.5), base_s1: $(points 1 0.0),"
    adapters+=" copy20_s1: $(points 1 0.2), copy50_s1: $(points 1 0.5)}"
    for set in "${sets[@]}"; do
      OMP_NUM_THREADS=1 "$lkv" eval --config "$here/configs/visible/$set.yaml" --output "$out/$set" \
        --adapter "$(points 0 0.0)" --adapters "$adapters" --shard "$shard" --progress false
    done
    ;;
  report)
    folders=()
    for set in "${sets[@]}"; do folders+=("$out/$set"); done
    pool() { "$python" experiments/reach/far_kinds.py "${folders[@]}" --budgets 128 256 --intervals "$@" > /dev/null; }
    pool --reference lookaheadkv --out "$out/copy_s0.md" \
      --methods lookaheadkv lookaheadkv:copy20_s0 lookaheadkv:copy50_s0
    pool --reference lookaheadkv:base_s1 --out "$out/copy_s1.md" \
      --methods lookaheadkv:base_s1 lookaheadkv:copy20_s1 lookaheadkv:copy50_s1
    ;;
  *)
    echo "usage: copy_lever.sh run K/N | report" >&2
    exit 2
    ;;
esac
