"""lkv: LookaheadKV, learned KV-cache eviction for long-context LLMs."""

__version__ = "0.1.0"
