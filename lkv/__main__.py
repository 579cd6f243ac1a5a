"""``python -m lkv VERB ...``: the same entry point as the ``lkv`` script."""

from lkv.cli import main

main()
