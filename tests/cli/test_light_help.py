"""`lkv label --help` answers without importing torch: the signature's types are light, and the predict loop's
module (torch, Lightning) is imported only once a run starts."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_label_help_imports_no_torch():
    check = (
        "import sys; from lkv.cli import main\n"
        "try:\n    main(['label', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "--response_tokens" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout
