"""NeedleEval: real eviction by the module being trained, logged every `every_n_steps`, a no-op in between."""

import json

import lightning as L
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lkv.train.callbacks import ImportanceImages, NeedleEval
from lkv.train.datamodule import LabelDataModule
from lkv.train.module import LookaheadKVModule
from tests.conftest import TINY

# Far above the tiny needle prompts' length: LookaheadKV keeps everything and must answer as FullKV does.
NO_EVICTION = 4096


def test_needle_eval_runs_every_n_steps_and_logs_scores(tiny_backbone, label_folders, tiny_corpus, tmp_path):  # noqa: F811
    needle = NeedleEval(
        budgets=(8, NO_EVICTION),
        lengths=(60,),
        depths=(0.5,),
        every_n_steps=4,
        max_new_tokens=3,
        essays_dir=str(tiny_corpus[0]),
        heldout_fraction=0.5,
    )
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        logger=TensorBoardLogger(tmp_path, name="tb", version="v"),
        callbacks=[needle, ImportanceImages()],
        val_check_interval=2,  # validations after steps 2, 4 and 6
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = LabelDataModule(train=str(label_folders["train"]), val=str(label_folders["val"]))
    trainer.fit(LookaheadKVModule(model="tiny", **TINY), data)

    # one run: at step 4 (step 2 is before the first period, step 6 before the next one at 8)
    runs = sorted(p.name for p in (tmp_path / "tb" / "v" / "needle").iterdir())
    assert runs == ["step4"]
    rows = [
        json.loads(line) for line in (tmp_path / "tb" / "v" / "needle" / "step4" / "results.jsonl").open()
    ]
    assert {(r["method"], r["budget"]) for r in rows} == {
        ("fullkv", "full"),
        ("lookaheadkv", "8"),
        ("lookaheadkv", "4096"),
    }
    evicted = next(r for r in rows if r["budget"] == "8")
    assert evicted["kept_tokens"] == 8 < evicted["prompt_tokens"]
    full, kept_all = (next(r for r in rows if r["budget"] == b) for b in ("full", "4096"))
    assert kept_all["prediction"] == full["prediction"]

    events = EventAccumulator(str(tmp_path / "tb" / "v")).Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    validations = [step for step, _ in logged["val/recall@8"]]  # validation itself still ran every time
    assert len(validations) == 3
    assert logged["val/needle@8"] == [(validations[1], pytest.approx(evicted["score"]))]
    assert logged["val/needle_fullkv"] == [(validations[1], pytest.approx(full["score"]))]
    assert logged[f"val/needle@{NO_EVICTION}"] == logged["val/needle_fullkv"]


def test_needle_eval_rejects_a_bad_period():
    with pytest.raises(ValueError, match="every_n_steps must be positive, got 0"):
        NeedleEval(every_n_steps=0)


def test_needle_reach_logs_each_module_and_the_oracle(tiny_backbone, label_folders, tiny_corpus, tmp_path):  # noqa: F811
    """NeedleReach: the main module, an ablation sibling and the Oracle, each per budget, every validation; the
    logged means are those of the rows it wrote."""
    from lkv.eval.tasks import NeedleFamilyTask
    from lkv.sweep.ablation import LookaheadAblation
    from lkv.train.callbacks import NeedleReach

    needles = NeedleFamilyTask(
        distribution="in",
        families=("magic_number",),
        lengths=(200,),
        distances=(30, 120),
        essays_dir=str(tiny_corpus[0]),
        heldout_fraction=0.5,
    )
    ablation = LookaheadAblation(grid={"seed": [1]}, output=str(tmp_path / "ablation"), overhead_tokens=0)
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=TensorBoardLogger(tmp_path, name="tb", version="v"),
        callbacks=[ablation, NeedleReach(needles, budgets=(8, NO_EVICTION))],
        val_check_interval=2,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = LabelDataModule(train=str(label_folders["train"]), val=str(label_folders["val"]))
    trainer.fit(LookaheadKVModule(model="tiny", **TINY), data)

    assert sorted(p.name for p in (tmp_path / "tb" / "v" / "reach").iterdir()) == ["step2", "step4"]
    rows = [json.loads(line) for line in (tmp_path / "tb" / "v" / "reach" / "step4" / "results.jsonl").open()]
    assert {r["method"] for r in rows} == {"lookaheadkv", "oracle", "seed=1"}
    events = EventAccumulator(str(tmp_path / "tb" / "v")).Reload()
    logged = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    for method, tag in (
        ("lookaheadkv", "val/needle_kept@8"),
        ("seed=1", "ablation/seed=1/val/needle_kept@8"),
        ("oracle", "val/oracle_needle_kept@8"),
    ):
        scores = [r["score"] for r in rows if r["method"] == method and r["budget"] == "8"]
        assert len(logged[tag]) == 2 and logged[tag][-1] == pytest.approx(sum(scores) / len(scores))
    assert logged[f"val/needle_kept@{NO_EVICTION}"] == [1.0, 1.0]
