"""LabelDataModule's ``limit_train_samples``: the first N rows by id, nested, whatever the seed, shuffling,
shard layout, stored order or world size; a clear error when a folder holds fewer."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lkv.labels.shards import ShardWriter, load_labels, read_meta, row_scores
from lkv.sweep.grid import grid_points
from lkv.sweep.points import point_config, set_key
from lkv.train.cli import lightning_main
from lkv.train.datamodule import LabelDataModule
from tests.conftest import make_label_folder

ROOT = Path(__file__).resolve().parents[2]
IDS = [f"s0-{i}" for i in range(7)]


def epoch_ids(dm: LabelDataModule, rank: int = 0, world: int = 1) -> list[str]:
    """One epoch's sample ids on ``rank`` of ``world`` (a stand-in trainer gives the DataModule its rank)."""
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, current_epoch=0)
    dm.setup("fit")
    return [sample["id"] for batch in dm.train_dataloader() for sample in batch]


def rewrite_reversed(folder: Path, target: Path, shard_size: int) -> Path:
    """``folder``'s rows written to ``target`` in reverse stored order (as length-sorted batches reorder them)."""
    meta = read_meta(folder)
    writer = ShardWriter(target, meta, shard_size=shard_size)
    for row in reversed(list(load_labels(folder))):
        scores = row_scores(row, meta, folder)
        writer.add(
            id=row["id"], prompt_ids=row["prompt_ids"], response_ids=row["response_ids"], scores=scores
        )
    writer.flush()
    return target


@pytest.fixture
def folders(tiny_llama, tmp_path) -> tuple[str, str]:
    """The same 7 labels (ids s0-0..s0-6) twice: in id order in shards of 3, reversed in shards of 2."""
    forward = make_label_folder(*tiny_llama, tmp_path / "forward", num=7, shard_size=3)
    return str(forward), str(rewrite_reversed(forward, tmp_path / "reversed", shard_size=2))


def test_the_first_n_by_id_whatever_the_order_seed_or_shuffling(folders):
    forward, backward = folders
    assert [row["id"] for row in load_labels(backward)] == IDS[::-1]  # stored order is not id order
    for limit in (2, 4, 7):
        subsets = {
            frozenset(
                epoch_ids(
                    LabelDataModule(train=folder, limit_train_samples=limit, seed=seed, shuffle=shuffle)
                )
            )
            for folder in folders
            for seed in (0, 1)
            for shuffle in (True, False)
        }
        assert subsets == {frozenset(IDS[:limit])}  # nested: the first 2 ⊂ the first 4 ⊂ all 7
    # one epoch sees each kept row once; the shuffled order still follows the seed
    assert len(epoch_ids(LabelDataModule(train=backward, limit_train_samples=4, seed=1))) == 4
    # a limit of every row is no limit
    assert epoch_ids(LabelDataModule(train=forward, limit_train_samples=7, seed=3)) == epoch_ids(
        LabelDataModule(train=forward, seed=3)
    )


def test_two_ddp_ranks_share_the_same_subset(folders):
    _, backward = folders
    for limit in (4, 5):  # 5 rows over 2 ranks: one row is left out of the epoch, as without a limit
        ranks = [
            epoch_ids(LabelDataModule(train=backward, limit_train_samples=limit, seed=2), r, 2)
            for r in (0, 1)
        ]
        assert len(ranks[0]) == len(ranks[1]) == limit // 2
        assert not set(ranks[0]) & set(ranks[1]) and set(ranks[0]) | set(ranks[1]) <= set(IDS[:limit])
    # an even limit: the two ranks together see exactly the rows one process sees
    together = [
        epoch_ids(LabelDataModule(train=backward, limit_train_samples=4, seed=2), r, 2) for r in (0, 1)
    ]
    assert sorted(together[0] + together[1]) == sorted(
        epoch_ids(LabelDataModule(train=backward, limit_train_samples=4))
    )


def test_each_train_folder_is_cut_to_the_limit_and_validation_is_not(tiny_llama, folders, tmp_path):
    forward, _ = folders
    other = str(make_label_folder(*tiny_llama, tmp_path / "other", num=3, seed=1, shard_size=2))
    dm = LabelDataModule(train=[forward, other], val=forward, limit_train_samples=2, shuffle=False)
    assert epoch_ids(dm) == ["s0-0", "s0-1", "s1-0", "s1-1"]
    assert len(dm.datasets["val"]) == 7


def test_a_limit_above_the_labels_names_the_folder_and_counts(folders):
    forward, _ = folders
    dm = LabelDataModule(train=forward, limit_train_samples=8)
    with pytest.raises(ValueError, match=r"limit_train_samples=8: label folder .*forward holds only 7 rows"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="limit_train_samples must be positive, got 0"):
        LabelDataModule(train=forward, limit_train_samples=0)
    with pytest.raises(ValueError, match=r"needs map-style data \(data.streaming: false\)"):
        LabelDataModule(train=forward, limit_train_samples=2, streaming=True)


def test_the_data_scaling_sweep_points_are_fit_configs_with_the_limit(tmp_path, capsys):
    """Every point of configs/sweeps/data_scaling_smollm2.yaml parses as an `lkv fit` config with its limit."""
    sweep = yaml.safe_load((ROOT / "configs/sweeps/data_scaling_smollm2.yaml").read_text())
    base = yaml.safe_load((ROOT / sweep["base"]).read_text())
    for key, value in sweep["overrides"].items():
        set_key(base, key, value)
    for values in grid_points(sweep["grid"]):
        config = point_config(base, values, tmp_path / "point", tmp_path / "tb")
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        with pytest.raises(SystemExit) as exit_info:
            lightning_main(["fit", "--config", str(path), "--print_config"])
        assert exit_info.value.code in (0, None)
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["data"]["limit_train_samples"] == values["data.limit_train_samples"]
        assert printed["trainer"]["max_steps"] == 512 and printed["trainer"]["max_epochs"] == -1
