"""Prompt sources, label shards and the DataModule."""
