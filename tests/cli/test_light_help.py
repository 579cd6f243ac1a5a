"""`lkv label --help`, `lkv generate --help`, `lkv eval --help` and `lkv sweep --help` answer without importing
torch: the signatures' types are light (:mod:`lkv.eviction.names`, :mod:`lkv.eval.prompt_settings`, the task classes), and the run's
modules (torch, transformers, Lightning) are imported only once a run starts."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("verb", "flag"),
    [
        ("label", "--response_tokens"),
        ("generate", "--head_budget"),
        ("eval", "NeedleTokenTask"),
        ("sweep", "--allow_partial"),
    ],
)
def test_help_imports_no_torch(verb, flag):
    check = (
        "import sys; from lkv.cli import main\n"
        f"try:\n    main([{verb!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert flag in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
