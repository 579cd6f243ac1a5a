"""LabelDataModule: variable-length batches, streaming, seeded shuffling, responses-only mode, model checks."""

import pytest
import torch

from lkv.labels.mix import LabelSource, MixedLabels, MixSampler, StreamedLabels, epoch_quotas
from lkv.model.backbone import model_signature
from lkv.train.datamodule import LabelDataModule
from tests.conftest import make_label_folder


def ids_of(loader) -> list[str]:
    return [sample["id"] for batch in loader for sample in batch]


def train_loader(dm: LabelDataModule):
    dm.setup("fit")
    return dm.train_dataloader()


def test_batches_keep_variable_lengths(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    make_label_folder(model, tokenizer, tmp_path / "train", num=4)
    dm = LabelDataModule(train=str(tmp_path / "train"), batch_size=2, shuffle=False)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [2, 2]
    sample = batches[1][1]
    assert sample["id"] == "s0-3"
    assert sample["prompt_ids"].shape == (29,) and sample["prompt_ids"].dtype == torch.long
    assert sample["scores"].shape == (3, 2, 29)
    torch.testing.assert_close(sample["scores"].sum(-1), torch.ones(3, 2))
    assert dm.val_dataloader() == []  # no validation folder: Lightning skips validation


def test_shuffling_is_seeded_and_streaming_sees_the_same_samples(tiny_llama, tmp_path, no_stream_sleep):
    model, tokenizer = tiny_llama
    folder = str(make_label_folder(model, tokenizer, tmp_path / "train", num=7))
    order = ids_of(train_loader(LabelDataModule(train=folder, shuffle=False)))
    assert order == [f"s0-{i}" for i in range(7)]
    first = ids_of(train_loader(LabelDataModule(train=folder, seed=1)))
    again = ids_of(train_loader(LabelDataModule(train=folder, seed=1)))
    other = ids_of(train_loader(LabelDataModule(train=folder, seed=2)))
    assert first == again and sorted(first) == order and first != order and other != first
    streamed = LabelDataModule(train=folder, streaming=True, seed=1, shuffle_buffer=4)
    streamed_ids = ids_of(train_loader(streamed))
    assert sorted(streamed_ids) == order and streamed_ids != order
    streamed.set_epoch(1)
    assert ids_of(streamed.train_dataloader()) != streamed_ids


def test_responses_only_folder_gives_no_scores(tiny_llama, tmp_path):
    model, tokenizer = tiny_llama
    folder = make_label_folder(model, tokenizer, tmp_path / "train", num=2, store_scores=False)
    dm = LabelDataModule(train=str(folder), shuffle=False)
    (sample,) = next(iter(train_loader(dm)))
    assert sample["scores"] is None and sample["response_ids"].numel() > 0


def test_check_model_names_folder_and_both_models(tiny_llama, tiny_qwen, tmp_path):
    llama, tokenizer = tiny_llama
    qwen, qwen_tokenizer = tiny_qwen
    folder = make_label_folder(llama, tokenizer, tmp_path / "heldout", num=1)
    dm = LabelDataModule(train=str(folder), val=str(folder))
    dm.check_model(model_signature(llama, tokenizer, "same"))
    with pytest.raises(
        ValueError, match=r"label folder .*heldout \(train\).*llama.*qwen3.*num_layers: 3 vs 2"
    ):
        dm.check_model(model_signature(qwen, qwen_tokenizer, "other"))


def test_missing_folder_is_a_clear_error(tmp_path):
    dm = LabelDataModule(train=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="lkv label"):
        dm.setup("fit")


def epochs_of(dm: LabelDataModule, epochs: int) -> list[list[str]]:
    """Sample ids of ``epochs`` consecutive epochs (setting the epoch as Lightning and the module do)."""
    dm.setup("fit")
    loader = dm.train_dataloader()
    out = []
    for epoch in range(epochs):
        dm.set_epoch(epoch)
        if isinstance(loader.sampler, MixSampler):
            loader.sampler.set_epoch(epoch)
        out.append(ids_of(loader))
    return out


@pytest.fixture
def two_sources(tiny_llama, tmp_path, no_stream_sleep) -> tuple[str, str]:
    """Label folders ``a`` (6 rows, ids s0-*) and ``b`` (3 rows, ids s1-*) of the tiny Llama."""
    model, tokenizer = tiny_llama
    a = make_label_folder(model, tokenizer, tmp_path / "a", num=6, seed=0, shard_size=4)
    b = make_label_folder(model, tokenizer, tmp_path / "b", num=3, seed=1, shard_size=2)
    return str(a), str(b)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_weighted_mix_draws_its_quotas_every_epoch_deterministically(two_sources, streaming):
    # 9 rows, weights 1:2 -> 3 rows of `a` (a different 3 each epoch) and 6 of `b` (each row twice)
    a, b = two_sources
    settings = {"train": [a, b], "weights": [1.0, 2.0], "streaming": streaming, "shuffle_buffer": 4}
    epochs = epochs_of(LabelDataModule(seed=3, **settings), 3)
    for ids in epochs:
        assert len(ids) == 9
        from_a = [i for i in ids if i.startswith("s0-")]
        assert len(from_a) == 3 and len(set(from_a)) == 3
        assert sorted(i for i in ids if i.startswith("s1-")) == sorted(2 * [f"s1-{i}" for i in range(3)])
    assert set(epochs[0]) != set(epochs[1])  # `a`'s subset changes per epoch
    assert epochs_of(LabelDataModule(seed=3, **settings), 3) == epochs
    assert epochs_of(LabelDataModule(seed=4, **settings), 1)[0] != epochs[0]
    # a zero weight leaves a folder out: the epoch is `b` three times over
    only_b = epochs_of(LabelDataModule(**{**settings, "weights": [0.0, 1.0]}), 1)[0]
    assert sorted(only_b) == sorted(3 * [f"s1-{i}" for i in range(3)])
    # without weights: every row of both folders once per epoch
    unweighted = epochs_of(LabelDataModule(train=[a, b], streaming=streaming, seed=3), 1)[0]
    assert sorted(unweighted) == sorted([f"s0-{i}" for i in range(6)] + [f"s1-{i}" for i in range(3)])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("weights", [None, [1.0, 2.0]])
def test_every_rank_gets_the_same_number_of_rows(two_sources, world, weights):
    # 9 rows (shards of 4+2 and 2+1) do not split evenly over 2 ranks, nor by shards over 3: equal shares
    a, b = two_sources
    sources = [LabelSource.open(a), LabelSource.open(b)]
    quotas = epoch_quotas([s.rows for s in sources], weights)
    mixed = MixedLabels(sources)
    for epoch in (0, 1):
        streamed, mapped = [], []
        for rank in range(world):
            stream = StreamedLabels(sources, quotas, rank, world, shuffle=True, seed=0, buffer=3)
            stream.set_epoch(epoch)
            rows = [row["id"] for row in stream]
            assert len(rows) == len(stream) == sum(q // world for q in quotas)
            streamed.append(rows)
            sampler = MixSampler(mixed, quotas, world, rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            mapped.append(list(sampler))
            assert len(mapped[-1]) == len(sampler) == sum(quotas) // world
        assert len({len(rows) for rows in streamed}) == 1 and len({len(ids) for ids in mapped}) == 1
        if weights is None:  # every row at most once per epoch over all ranks
            everything = [i for rows in streamed for i in rows]
            assert len(everything) == len(set(everything))
            everything = [i for ids in mapped for i in ids]
            assert len(everything) == len(set(everything)) and len(everything) >= 9 - (world - 1)


def test_streamed_workers_split_a_rank_into_equal_parts(two_sources):
    # two DataLoader workers per rank: still the rank's exact rows, once each
    a, b = two_sources
    sources = [LabelSource.open(a), LabelSource.open(b)]
    quotas = epoch_quotas([s.rows for s in sources], None)
    stream = StreamedLabels(sources, quotas, 1, 2, shuffle=True, seed=0, buffer=2)
    alone = sorted(row["id"] for row in stream)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)
    assert sorted(row["id"] for row in loader) == alone and len(alone) == 3 + 1


def test_a_source_from_another_model_is_refused(tiny_llama, tiny_qwen, tmp_path):
    llama, qwen = tiny_llama, tiny_qwen
    make_label_folder(*llama, tmp_path / "chatqa", num=2)
    make_label_folder(*qwen, tmp_path / "tulu", num=2)
    dm = LabelDataModule(train=[str(tmp_path / "chatqa"), str(tmp_path / "tulu")])
    with pytest.raises(ValueError, match=r"label folder .*tulu \(mixed with .*chatqa.*num_layers: 3 vs 2"):
        dm.setup("fit")


def test_bad_weights_are_refused_before_reading(tmp_path):
    with pytest.raises(ValueError, match=r"data.weights: expected one weight per train folder \(2\), got 1"):
        LabelDataModule(train=[str(tmp_path / "a"), str(tmp_path / "b")], weights=[1.0])
    with pytest.raises(ValueError, match="data.weights: expected non-negative"):
        LabelDataModule(train=[str(tmp_path / "a"), str(tmp_path / "b")], weights=[0.0, 0.0])


def test_the_streamed_shuffle_buffer_is_bounded_in_bytes(tiny_llama, tmp_path, monkeypatch, no_stream_sleep):
    """With stored scores a 16K-token row is 16 MiB, so the paper recipe's 2000-row buffer would hold 32 GiB per
    DataLoader worker: the buffer also stops at ``data.shuffle_buffer_mib``. Rows here are made 256 KiB each
    (the stored scores padded out), so 1 MiB holds 4 of them; every row still comes exactly once."""
    import numpy as np

    import lkv.labels.mix

    model, tokenizer = tiny_llama
    folder = str(make_label_folder(model, tokenizer, tmp_path / "train", num=12, shard_size=5))
    read = lkv.labels.mix.read_rows
    pulled: list[int] = []

    def big_rows(path, first, end):
        for row in read(path, first, end):
            pulled.append(1)
            yield {**row, "padding": np.zeros(2**18, dtype=np.uint8)}  # 256 KiB

    monkeypatch.setattr(lkv.labels.mix, "read_rows", big_rows)
    dm = LabelDataModule(train=folder, streaming=True, seed=1, shuffle_buffer=2000, shuffle_buffer_mib=1)
    dm.setup("fit")
    held = []
    seen = []
    for row in dm.datasets["train"]:
        held.append(len(pulled) - len(seen) - 1)  # rows read but not yet handed out, besides this one
        seen.append(row["id"])
    assert sorted(seen) == sorted(f"s0-{i}" for i in range(12)) and seen != sorted(seen)
    assert max(held) <= 4  # 1 MiB of 256 KiB rows (the one being swapped in counted out)
    unbounded = LabelDataModule(train=folder, streaming=True, seed=1, shuffle_buffer=2000)
    unbounded.setup("fit")
    pulled.clear()
    held.clear()
    seen.clear()
    for row in unbounded.datasets["train"]:
        held.append(len(pulled) - len(seen) - 1)
        seen.append(row["id"])
    assert max(held) == 11  # the default 1 GiB does not bind here: the whole stream is buffered
    with pytest.raises(ValueError, match="data.shuffle_buffer_mib must be positive"):
        LabelDataModule(train=folder, streaming=True, shuffle_buffer_mib=0)


def test_buffered_shuffle_keeps_its_byte_bound_when_rows_grow():
    """Small rows fill the buffer by count; larger ones later push it out until it is back within the bytes."""
    import random

    import numpy as np

    from lkv.labels.mix import ShuffleBuffer, _buffered

    rows = [{"id": i, "a": np.zeros(10 if i < 50 else 1000, dtype=np.uint8)} for i in range(200)]
    pulled = []

    def stream():
        for row in rows:
            pulled.append(row)
            yield row

    out, worst = [], 0
    for row in _buffered(stream(), ShuffleBuffer(40, 5000, random.Random(0))):
        out.append(row["id"])
        held_ids = {r["id"] for r in pulled} - set(out)  # read, not yet handed out
        worst = max(worst, sum(rows[i]["a"].nbytes for i in held_ids))
        assert len(held_ids) <= 40
    assert sorted(out) == list(range(200)) and out != list(range(200))
    assert worst <= 5000 + 1000  # the bound plus the row being swapped in


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_stream_resumes_at_every_row_and_reads_only_the_rows_still_to_come(
    two_sources, monkeypatch, shuffle
):
    """A stream's state after ``k`` rows resumes with exactly the rest of the uninterrupted iteration. Before
    ``k`` only the small columns are read (the buffer's draws are replayed over the rows' sizes): every row
    of the resumed iteration is read whole at most once, no other. The buffer of 3 rows and 1700 bytes (rows are
    about 700 to 1100 bytes) is bound by its bytes as well as its count."""
    import lkv.labels.mix

    a, b = two_sources
    sources = [LabelSource.open(a), LabelSource.open(b)]
    quotas = epoch_quotas([s.rows for s in sources], [1.0, 2.0])  # 3 rows of `a`, each row of `b` twice

    def stream() -> StreamedLabels:
        return StreamedLabels(sources, quotas, 0, 1, shuffle=shuffle, seed=5, buffer=3, buffer_bytes=1700)

    read, read_at, whole_rows = lkv.labels.mix.read_rows, lkv.labels.mix.read_rows_at, []

    def counting(path, first, end, columns=None):
        for row in read(path, first, end, columns):
            if columns is None:
                whole_rows.append(row["id"])
            yield row

    def counting_at(path, rows):
        found = read_at(path, rows)
        whole_rows.extend(row["id"] for row in found.values())
        return found

    monkeypatch.setattr(lkv.labels.mix, "read_rows", counting)
    monkeypatch.setattr(lkv.labels.mix, "read_rows_at", counting_at)
    uninterrupted = stream()
    uninterrupted.set_epoch(1)
    whole = [row["id"] for row in uninterrupted]
    assert len(whole) == 9
    for k in range(len(whole) + 1):
        killed = stream()
        killed.set_epoch(1)
        rows = iter(killed)
        assert [next(rows)["id"] for _ in range(k)] == whole[:k]
        state = killed.state_dict()
        assert state == {"epoch": 1, "yielded": k}
        resumed = stream()  # epoch 0 until the state says otherwise
        resumed.load_state_dict(state)
        whole_rows.clear()
        assert [row["id"] for row in resumed] == whole[k:], k
        # a row of `b` that the buffer holds twice is read once
        assert set(whole_rows) == set(whole[k:]) and len(whole_rows) <= len(whole) - k, k
    with pytest.raises(ValueError, match="streamed label state: expected non-negative 'epoch' and 'yielded'"):
        stream().load_state_dict({"epoch": 1})
