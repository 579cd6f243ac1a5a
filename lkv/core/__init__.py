"""Stage 0, the mechanics every stage uses: attention capture, prefill/decode over an explicit cache, cache
gathering, importance math and ranking metrics, and the TensorBoard summaries every stage writes. Imports
nothing of lkv above it and never Lightning."""
