#!/usr/bin/env bash
# Every needle set of sections 13-20 pooled (the full evaluation's 1K and 3K needles, section 15's and 19's fresh
# 3K sets, section 20's fresh 5K set: 155 far, 117 near and 51 1K FullKV-solved needles), each method paired by
# sample. Writes pooled/vs_before.md (against the demo recipe), vs_probe.md (against the right-answer probe
# alone) and vs_oracle.md (against the Oracle, on the 129 far needles of the sets it was run with), and the
# audit's tables (experiments/reach/sections/22_audit.md):
#   vs_oracle_all.md - the same with the full evaluation's Oracle rows (experiments/length_mix/results/oracle_3k,
#                      the same FullKV answers), so the Oracle covers all 155 far needles;
#   fresh_only.md    - only the two sets made after every setting but the sentence rules was fixed
#                      (replica2_3k, fresh_5k: 70 far needles);
#   training_free.md - the five training-free methods beside the full evaluation's module (unpooled, as scored
#                      there) on its needles (51 1K, 26 far, 21 near): KeyDiff keeps 22 of the 51 at C = 256;
#   with_far4k.md    - the recipe with section 3's fresh 4K set added (far_gold_probe_gold, far_scaled: 12 far and
#                      9 near FullKV-solved needles), left out of the pooled tables above;
#   needles.md       - what the pooled needles are made of (haystacks, formats, lengths, the essay most windows
#                      include, measured distance from the end), by needle_mix.py;
#   seeds_union.md, seeds_recipe.md - module seed 1 against seed 0 in the union and in the recipe: the two
#                      "seeds" share one probe (probe_gold_s0), so their outcomes are far from independent.
# The folders name one setting differently, so far_kinds.py's --alias and FOLDER=NAME map each to one name:
#   lookaheadkv            - the union of the right-answer module (seed 0) and the right-answer probe;
#   lookaheadkv:union_s1   - the same with module seed 1;
#   lookaheadkv:scaled(_s1) - those unions with the scaled sentence share (the recipe);
#   lookaheadkv:before     - the full evaluation's module, pooled (kernel 7) as every module here;
#   probe                  - the right-answer probe alone.
# Run from anywhere: experiments/reach/pooled/pooled.sh (PYTHON defaults to python).
set -euo pipefail
cd "$(dirname "$0")/../../.."
python=${PYTHON:-python}
reach=experiments/reach
out=$reach/pooled
full=("$reach/gold_probe_gold" "$reach/scaled_full=sc" "$reach/full_evidence_far")
fresh=("$reach/replica2_3k" "$reach/near2_3k" "$reach/fresh_5k")
sets=("${full[@]}" "$reach/replica_3k" "$reach/scaled_3k=sc" "${fresh[@]}")
aliases=(lookaheadkv:scaled=lookaheadkv:sc lookaheadkv:scaled=lookaheadkv:scaled_s0
         lookaheadkv:scaled_s1=lookaheadkv:scaled_s1:sc
         lookaheadkv:before=lookaheadkv:before_pool)
recipe=(lookaheadkv lookaheadkv:union_s1 lookaheadkv:scaled lookaheadkv:scaled_s1)
pool() { "$python" $reach/far_kinds.py "$@" --budgets 128 256 > /dev/null; }

pool "${sets[@]}" --alias "${aliases[@]}" --reference lookaheadkv:before --out $out/vs_before.md \
  --methods oracle snapkv probe lookaheadkv:before "${recipe[@]}"
pool "${sets[@]}" --alias "${aliases[@]}" --reference probe --out $out/vs_probe.md \
  --methods probe "${recipe[@]}" lookaheadkv:before oracle
pool "${sets[@]}" --alias "${aliases[@]}" --reference oracle --out $out/vs_oracle.md --methods oracle "${recipe[@]}"
pool "${sets[@]}" experiments/length_mix/results/oracle_3k --alias "${aliases[@]}" --reference oracle \
  --out $out/vs_oracle_all.md --methods oracle "${recipe[@]}"
pool "${fresh[@]}" --alias "${aliases[@]}" --reference lookaheadkv:before --out $out/fresh_only.md \
  --methods oracle lookaheadkv:before "${recipe[@]}"
pool experiments/full_evidence/results --reference lookaheadkv --out $out/training_free.md \
  --methods lookaheadkv snapkv pyramidkv streamingllm keydiff expected_attention
pool "${sets[@]}" "$reach/far_gold_probe_gold" "$reach/far_scaled=sc" --alias "${aliases[@]}" \
  --reference lookaheadkv --out $out/with_far4k.md --methods "${recipe[@]}"
pool "${sets[@]}" --alias "${aliases[@]}" --reference lookaheadkv --out $out/seeds_union.md \
  --methods lookaheadkv lookaheadkv:union_s1
pool "${sets[@]}" --alias "${aliases[@]}" --reference lookaheadkv:scaled --out $out/seeds_recipe.md \
  --methods lookaheadkv:scaled lookaheadkv:scaled_s1
"$python" $reach/needle_mix.py "${sets[@]}" --out $out/needles.md > /dev/null
