#!/usr/bin/env bash
# Section 21 (lever e): the 4x-trained modules (1 344 steps) against section 12's (336 steps), each setting and
# seed paired by sample, pooled over the needle sets both were scored on. Writes pooled/long_SETTING_sS.md:
#   alone  - the module alone (kernel 7): the full evaluation's needles and section 15's fresh 3K set;
#   union  - in the union with the right-answer probe: those two and section 19's fresh 3K sets (far and near);
#   scaled - the union with the scaled sentence share: the same four sets.
# Each folder's methods are renamed to one name per (setting, seed, training length) with far_kinds.py's
# --alias, since the folders name them differently. Run from the repository root: experiments/reach/pooled/long.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
reach=experiments/reach
for setting in alone union scaled; do
  folders=("$reach/long_full=long" "$reach/gold=g" "$reach/gold_probe_gold" "$reach/scaled_full=sc"
           "$reach/long_3k=long" "$reach/replica_3k" "$reach/scaled_3k=sc")
  if [ "$setting" != alone ]; then
    folders+=("$reach/long_replica2_3k=long2" "$reach/replica2_3k" "$reach/long_near2_3k=long2" "$reach/near2_3k")
  fi
  for seed in 0 1; do
    # NAME=METHOD pairs: which method of which folder is this (setting, seed) at 336 and at 1 344 steps
    case $setting$seed in
      alone0) pairs="336=lookaheadkv:g 336=lookaheadkv:alone_s0 4x=lookaheadkv:long" ;;
      alone1) pairs="336=lookaheadkv:s1:g 336=lookaheadkv:alone_s1 4x=lookaheadkv:alone_s1:long" ;;
      union0) pairs="336=lookaheadkv 4x=lookaheadkv:union_s0:long 4x=lookaheadkv:long2" ;;
      union1) pairs="336=lookaheadkv:union_s1 4x=lookaheadkv:union_s1:long 4x=lookaheadkv:union_s1:long2" ;;
      scaled0) pairs="336=lookaheadkv:sc 336=lookaheadkv:scaled_s0 4x=lookaheadkv:scaled_s0:long
                      4x=lookaheadkv:scaled_s0:long2" ;;
      scaled1) pairs="336=lookaheadkv:scaled_s1:sc 336=lookaheadkv:scaled_s1 4x=lookaheadkv:scaled_s1:long
                      4x=lookaheadkv:scaled_s1:long2" ;;
    esac
    name=lookaheadkv:${setting}_s${seed}
    aliases=()
    for pair in $pairs; do aliases+=("${name}_${pair%%=*}=${pair#*=}"); done
    python experiments/reach/far_kinds.py "${folders[@]}" --alias "${aliases[@]}" --reference "${name}_336" \
      --methods "${name}_336" "${name}_4x" --budgets 128 256 --out "$reach/pooled/long_${setting}_s${seed}.md"
  done
done
