"""The stage layers of pyproject's import-linter contracts hold, and each contract breaks when one import
that runs against the flow is put back (so the contracts are not vacuous)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
]


def lint(tree: Path) -> subprocess.CompletedProcess:
    # run from the copy, so `lkv` resolves to it rather than to the installed package
    return subprocess.run(
        [*LINT, "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "lkv", copy / "lkv", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_the_layers_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# (file, line put back at its end, the contract it must break)
AGAINST_THE_FLOW = [
    # the eviction stage loading a checkpoint through the LightningModule (as `load_lookahead` once did)
    (
        "lkv/eviction/compressor.py",
        "def _ckpt():\n    from lkv.train.module import LookaheadKVModule\n",
        "stages:",
    ),
    ("lkv/eval/report.py", "import lightning\n", "without Lightning"),
    # evaluation reaching up into a bridge to another tool (lkv.integrations sits above eval)
    ("lkv/eval/runner.py", "def _bridge():\n    from lkv.integrations.kvpress import LkvPress\n", "stages:"),
    ("lkv/eviction/presses/oracle.py", "from lkv.labels.shards import read_meta\n", "stages:"),
    ("lkv/core/generation.py", "import datasets\n", "read no label shards"),
    ("lkv/commands/sweep.py", "def _main():\n    from lkv.cli import main\n", "entry point"),
    # a training callback reaching up into the grid runners (as NeedleReach once found the ablation's siblings)
    (
        "lkv/train/callbacks.py",
        "def _siblings():\n    from lkv.sweep.ablation import LookaheadAblation\n",
        "stages:",
    ),
    # the in-run ablation timing its modules through the benchmark runner above it
    ("lkv/perf/overhead.py", "def _sweep():\n    from lkv.sweep.grid import grid_points\n", "stages:"),
    # assets <-> backbone, the cycle the GGUF loader's own module removed
    ("lkv/model/assets.py", "def _load():\n    from lkv.model.backbone import load_backbone\n", "cycles"),
]


@pytest.mark.parametrize(
    ("path", "line", "contract"), AGAINST_THE_FLOW, ids=[a[2] + a[0] for a in AGAINST_THE_FLOW]
)
def test_each_contract_breaks_on_an_import_against_the_flow(tree, path, line, contract):
    target = tree / path
    original = target.read_text()
    target.write_text(original + "\n\n" + line)
    try:
        result = lint(tree)
    finally:
        target.write_text(original)
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if row.rstrip().endswith("BROKEN")]
    assert any(contract in row for row in broken), result.stdout


@pytest.mark.parametrize("new", ["lkv/newstage/__init__.py", "lkv/newstage.py"])
def test_a_top_level_module_the_layers_do_not_name_breaks_them(tree, new):
    """The stages contract is exhaustive: every package and module directly under ``lkv`` must be a layer."""
    path = tree / new
    path.parent.mkdir(exist_ok=True)
    path.write_text('"""A stage that no layer names."""\n')
    try:
        result = lint(tree)
    finally:
        path.unlink()
        if path.parent != tree / "lkv":
            path.parent.rmdir()
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if row.rstrip().endswith("BROKEN")]
    assert any("stages:" in row for row in broken), result.stdout
    assert "- lkv.newstage" in result.stdout and "not listed as layers" in result.stdout, result.stdout


def test_the_inference_commands_load_no_lightning(tmp_path):
    """`lkv eval` and `lkv generate` import the checkpoint export (for a ``.ckpt``) but, given an adapter
    folder, never load Lightning: the LightningModules are imported only when a checkpoint is exported."""
    check = (
        "import sys; import lkv.cli, lkv.commands.eval_run, lkv.commands.generate_run; "
        "from lkv.train.export import resolve_adapter, resolve_probe; "
        f"resolve_adapter({str(tmp_path)!r}); resolve_probe({str(tmp_path)!r}); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'pytorch_lightning'}))"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
