"""Stage 2a, ground truth: prompt sources, the labeller, label shards and the `lkv label` predict loop."""
