"""Stage 2b, eviction: presses (prefill-time scores), decode-time methods, the shared selector and the
:class:`~lkv.eviction.compressor.Compressor`. Never imports Lightning."""
