"""Measurement helpers behind ``lkv bench``: timing, peak memory, benchmark models, the naive training step."""
