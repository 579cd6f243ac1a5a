#!/bin/bash
# The labels of the data-scaling study (configs/sweeps/data_scaling_smollm2.yaml): 32 held-out prompts, then 512
# training prompts of the diversified mix. Resumable: rerun it and finished shards (16 prompts each) are kept.
#   experiments/data_scaling/label.sh > runs/data_scaling/label.log 2>&1
# One split per call, to label both at once on two cores:
#   experiments/data_scaling/label.sh heldout > runs/data_scaling/label-heldout.log 2>&1 &
#   experiments/data_scaling/label.sh train > runs/data_scaling/label-train.log 2>&1
set -e
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=${PYTHON:-/work/main/.venv/bin/python}
MIX='{summarize: 1, question: 1, extract: 1, code: 1, title: 1, keywords: 1, quote: 1, continue: 1, locate: 1, review: 1}'
FACTS='[magic_number, passcode, vault_code, room_number, colour]'
declare -A SIZE=([heldout]=32 [train]=512)
splits=("$@")
[ $# -gt 0 ] || splits=(heldout train)
for split in "${splits[@]}"; do
  set -- $split "${SIZE[$split]:?expected heldout or train, got $split}"
  echo "== $1 $2 start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -v nice -n 15 "$PY" -m lkv.cli label --output "runs/data_scaling/labels/$1" \
    --prompts BuiltinPrompts --prompts.split "$1" --prompts.num_prompts "$2" \
    --prompts.min_words 600 --prompts.max_words 800 \
    --prompts.family_weights "$MIX" --prompts.fact_formats "$FACTS" \
    --response_tokens 64 --max_prompt_tokens 1024 --truncation middle \
    --batch_size 8 --shard_size 16 --progress false
  echo "== $1 $2 end $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
