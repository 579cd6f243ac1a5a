"""One module per `lkv` verb; only :mod:`lkv.cli` imports them."""
