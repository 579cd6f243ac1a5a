"""A plain `lkv label` / `lkv fit` writing to a file (a pipe here) shows lkv's lines and progress, and no
library notice: no `Warning` or deprecation line, no litlogger advert. `LKV_VERBOSE=1` brings the notices
back, which is what shows that the filters, not a quiet run, keep them out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import fit_settings, label_args, lkv_command, make_workspace, subprocess_env

pytestmark = pytest.mark.multiprocess
# Lightning prints the warnings raised in its own files as `path:line: message`, without the category
NOISE = re.compile(r"warning|litlogger|deprecated", re.IGNORECASE)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("quiet"))


def run(args: list[str], cwd: Path, verbose: bool = False) -> str:
    """``lkv ARGS`` with stdout and stderr into one pipe (no terminal); its whole output."""
    env = {k: v for k, v in subprocess_env().items() if k != "LKV_VERBOSE"}
    if verbose:
        env["LKV_VERBOSE"] = "1"
    done = subprocess.run(
        lkv_command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def fit_args(root: Path, run_dir: Path) -> list[str]:
    """A 4-step fit with validation, a TensorBoard logger and the progress bar on, as a user's fit has."""
    settings = fit_settings(root, run_dir, max_steps=4)
    trainer = settings["trainer"]
    trainer.pop("logger")  # lkv fit's default TensorBoard logger: Lightning then notes the logging interval
    trainer["callbacks"] = trainer["callbacks"][:1]  # the checkpoint only
    trainer |= {"enable_progress_bar": True, "enable_model_summary": True, "val_check_interval": 2}
    settings["data"]["val"] = str(root / "train")
    run_dir.mkdir(parents=True)
    path = run_dir / "fit.yaml"
    path.write_text(yaml.safe_dump(settings))
    return ["fit", "--config", str(path)]


def noise(output: str) -> list[str]:
    return [line for line in output.splitlines() if NOISE.search(line)]


def test_label_and_fit_print_progress_lines_and_no_library_notices(workspace):
    labelled = run(
        label_args(
            workspace, workspace / "labels", workspace / "prompts.jsonl", progress="true", batch_size=2
        ),
        workspace,
    )
    assert not noise(labelled), noise(labelled)
    assert re.search(r"^lkv label: 4/4 batches \(100%\), .*8 prompts labelled$", labelled, re.M), labelled

    fitted = run(fit_args(workspace, workspace / "fit"), workspace)
    assert not noise(fitted), noise(fitted)
    lines = re.findall(r"^lkv fit: (\d+)/4 steps", fitted, re.M)
    assert lines == ["1", "2", "3", "4"], fitted
    assert re.search(r"^lkv fit: validation at step 2: .*val/recall@4 \d", fitted, re.M), fitted


def test_lkv_verbose_shows_the_library_notices(workspace):
    output = run(fit_args(workspace, workspace / "verbose-fit"), workspace, verbose=True)
    shown = noise(output)
    assert any("litlogger" in line for line in shown), output
    assert any("FutureWarning: `is_gradient_checkpointing`" in line for line in shown), output


# a progress bar's redraw, a tqdm bar's rate, a library bar's title, Lightning's layer table
BAR = re.compile(r"\r|it/s\]|━|Loading weights|Creating parquet|Generating train split|Total F(LOP|lop)s")


def test_piped_output_holds_no_progress_bar_and_no_layer_table(workspace):
    labelled = run(label_args(workspace, workspace / "quiet-labels", workspace / "prompts.jsonl"), workspace)
    assert not BAR.search(labelled), labelled
    assert labelled.splitlines()[-1].startswith("8 labelled prompts in 8 shards at "), labelled
    args = fit_args(workspace, workspace / "quiet-fit")
    settings = yaml.safe_load(Path(args[-1]).read_text())
    for key in ("enable_progress_bar", "enable_model_summary"):  # Lightning's defaults, as in the configs
        settings["trainer"].pop(key)
    Path(args[-1]).write_text(yaml.safe_dump(settings))
    fitted = run(args, workspace)
    assert not BAR.search(fitted) and "Seed set to" not in fitted, fitted
    assert re.findall(r"^lkv fit: (\d+)/4 steps", fitted, re.M) == ["1", "2", "3", "4"], fitted
    settings["trainer"]["max_steps"] = 5  # the documented resume: its own checkpoints are no warning
    Path(args[-1]).write_text(yaml.safe_dump(settings))
    resumed = run([*args, "--ckpt_path", "last"], workspace)
    assert not BAR.search(resumed) and "not empty" not in resumed, resumed
