"""Measurement helpers behind ``lkv bench``: timing, peak memory, benchmark models, the naive training step, and
the lookahead step's overhead over a prefill (also the cost figure of a sweep point and of an in-run ablation)."""
