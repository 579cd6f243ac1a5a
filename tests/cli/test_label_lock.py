"""One writer per label folder: a second `lkv label` on a folder being written is refused at once, a
killed writer's lock is no obstacle, and a folder of other files is never written into."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lkv.cli import main as lkv_main
from lkv.labels.lock import HOLDER_FILE
from tests.cli.conftest import (
    label_args,
    lkv_command,
    make_workspace,
    run_lkv,
    shard_ids,
    start_lkv,
    subprocess_env,
)

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("lock"))


def start_label(root: Path, output: Path, shard_size: int) -> subprocess.Popen:
    return start_lkv(label_args(root, output, root / "prompts.jsonl", shard_size=shard_size), cwd=root)


def holding(process: subprocess.Popen, folder: Path, timeout: float = 120) -> None:
    """Wait until ``process`` holds ``folder``'s lock (it recorded itself as the holder)."""
    deadline = time.monotonic() + timeout
    while not (folder / HOLDER_FILE).exists() or str(process.pid) not in (folder / HOLDER_FILE).read_text():
        assert process.poll() is None, f"the first `lkv label` ended early:\n{process.communicate()[0]}"
        assert time.monotonic() < deadline, "the first `lkv label` never took the lock"
        time.sleep(0.005)


def test_a_second_writer_is_refused_and_each_prompt_is_labelled_once(workspace, tmp_path):
    folder = tmp_path / "labels"
    first = start_label(workspace, folder, shard_size=2)
    holding(first, folder)
    os.kill(first.pid, signal.SIGSTOP)  # the first writer holds the lock, mid-run, while the second starts
    try:
        second = subprocess.run(
            lkv_command(*label_args(workspace, folder, workspace / "prompts.jsonl", shard_size=1)),
            cwd=workspace,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.kill(first.pid, signal.SIGCONT)
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output
    assert second.returncode == 1, second.stdout + second.stderr
    errors = second.stderr.strip().splitlines()
    assert errors[0].startswith("lkv label: error: --output ")
    assert f"another `lkv label` is writing this folder (pid {first.pid} on host " in errors[0]
    assert "Traceback" not in second.stderr
    assert sorted(shard_ids(folder)) == [f"q{i}" for i in range(8)]


def test_a_killed_writer_leaves_no_lock_behind(workspace, tmp_path):
    folder = tmp_path / "labels"
    first = start_label(workspace, folder, shard_size=2)
    holding(first, folder)
    first.kill()
    first.communicate()
    output = run_lkv(label_args(workspace, folder, workspace / "prompts.jsonl", shard_size=1), workspace)
    assert "8 labelled prompts" in output
    assert sorted(shard_ids(folder)) == [f"q{i}" for i in range(8)]


def test_a_folder_of_other_files_is_refused(workspace, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "lookahead.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        lkv_main(label_args(workspace, adapter, workspace / "prompts.jsonl"))
    assert exit_.value.code == 1
    error = capsys.readouterr().err.splitlines()[0]
    assert error == (
        f"lkv label: error: --output {adapter}: expected a new or empty folder or a label folder (meta.json, "
        "labels-r*-*.parquet), found other files: adapter_config.json, lookahead.json; choose another --output"
    )
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "lookahead.json"]


def test_a_terminated_run_says_what_it_kept_and_how_to_go_on(workspace, tmp_path):
    folder = tmp_path / "labels"
    first = start_label(workspace, folder, shard_size=1)
    holding(first, folder)
    first.terminate()
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 143, output
    last = output.strip().splitlines()[-1]
    args = label_args(workspace, folder, workspace / "prompts.jsonl", shard_size=1)
    assert last == (
        "lkv label: stopped by SIGTERM; the finished shards are kept; the same command labels the other "
        f"prompts: lkv {' '.join(args)}"
    )
    assert "Traceback" not in output
    run_lkv(args, workspace)
    assert sorted(shard_ids(folder)) == [f"q{i}" for i in range(8)]
