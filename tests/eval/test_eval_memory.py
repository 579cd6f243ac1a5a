"""`lkv eval`'s memory is bounded by design: at most the stacked FullKV caches and one more prompt's cache.

A counting probe (:class:`CacheProbe`, a ``TorchDispatchMode``) sees every tensor any operation makes; it
follows each K/V-shaped one ``(rows, kv_heads, seq, head_dim)`` holding a whole prompt's entries until its
storage is freed, and records the peak of their bytes in units of one prompt's full cache. Before the bound
(shared prefill caches kept while the FullKV requests deep-copied them and the batch stacked them again), a
chunk of 4 (sample, setting) pairs peaked at 12.2 caches question-aware and 11.5 question-agnostic on this
probe; the bound is ``B + 1`` plus the K/V of the one layer being computed (its key and value projections
and rotated keys: at most ``2 / L`` of a cache; docs/scale_out.md, "Evaluation memory").
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lkv.eval.run_end_task import EndTaskRun
from lkv.eval.runner import Evaluator
from lkv.eval.tasks import NeedleTask, encode_sample
from lkv.eval.units import device_batch_tokens
from lkv.eviction.presses import FullKVPress, OraclePress
from lkv.eviction.registry import make_method
from tests.conftest import TINY_HELDOUT

LAYERS = 8  # the K/V of the one layer being computed: at most 2/8 of a cache


class CacheProbe(TorchDispatchMode):
    """Peak bytes of live K/V tensors with at least ``min_entries`` positions (storages counted once)."""

    def __init__(self, kv_heads: int, head_dim: int, min_entries: int) -> None:
        super().__init__()
        self.kv_heads, self.head_dim, self.min_entries = kv_heads, head_dim, min_entries
        self.live: dict[int, int] = {}
        self.total = self.peak = 0

    def _free(self, pointer: int) -> None:
        self.total -= self.live.pop(pointer)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.ndim != 4:
                continue
            if tensor.shape[1] != self.kv_heads or tensor.shape[3] != self.head_dim:
                continue
            if tensor.shape[2] < self.min_entries:
                continue  # an evicted cache (C entries), or one decoding step's K/V
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            if pointer not in self.live:
                self.live[pointer] = storage.nbytes()
                self.total += storage.nbytes()
                weakref.finalize(storage, self._free, pointer)  # fires when the memory is freed
                self.peak = max(self.peak, self.total)
        return out


def chunk_task(corpus) -> NeedleTask:
    # four needles of ~630-690 prompt tokens: one chunk of B = 4
    return NeedleTask(
        lengths=(400,),
        depths=(0.5,),
        samples_per_cell=4,
        max_new_tokens=4,
        essays_dir=str(corpus[0]),
        heldout_fraction=TINY_HELDOUT,
    )


@pytest.mark.parametrize("setting", ["aware", "agnostic"])
def test_a_chunk_holds_at_most_b_plus_one_full_caches(make_tiny_model, tiny_corpus, tmp_path, setting):
    model, tokenizer = make_tiny_model("llama", num_hidden_layers=LAYERS)
    task = chunk_task(tiny_corpus)
    samples = task.samples(tokenizer)
    parts = [encode_sample(sample, tokenizer) for sample in samples]
    prompts = [len(c) + len(q) if setting == "aware" else len(c) for c, q in parts]
    longest = max(len(c) + len(q) for c, q in parts) + task.max_new_tokens  # the FullKV answer's cache
    config = model.config
    one_cache = 2 * LAYERS * config.num_key_value_heads * longest * config.head_dim * 4  # fp32 K + V
    presses = {
        "fullkv": FullKVPress(),
        "snapkv": make_method("snapkv", window=4),
        "pyramidkv": make_method("pyramidkv", window=4),
        "laq": make_method("laq", window=4),
        "oracle": OraclePress(),
    }
    probe = CacheProbe(config.num_key_value_heads, config.head_dim, min_entries=min(prompts))
    batch = len(samples)
    with probe:
        rows = Evaluator(
            model, tokenizer, presses, [16], [setting], tmp_path, progress=False, batch_size=batch
        ).run([task])
    assert len(rows) == batch * len(presses)
    caches = probe.peak / one_cache
    print(f"{setting}: peak {caches:.2f} full caches at B = {batch}")
    assert caches <= batch + 1 + 2 / LAYERS


def test_chunks_are_capped_by_tokens_with_the_same_rows(tiny_llama, tiny_corpus, tmp_path, monkeypatch):
    model, tokenizer = tiny_llama
    task = NeedleTask(
        lengths=(20, 40, 60),
        depths=(0.5,),
        max_new_tokens=4,
        essays_dir=str(tiny_corpus[0]),
        heldout_fraction=TINY_HELDOUT,
    )
    entries = sorted(
        (sum(map(len, encode_sample(s, tokenizer))) for s in task.samples(tokenizer)), reverse=True
    )
    presses = {"fullkv": FullKVPress(), "snapkv": make_method("snapkv", window=4)}
    chunks: list[list[int]] = []
    run_chunk = EndTaskRun._run_chunk

    def spy(self, task, units):
        chunks.append([unit.entries for unit in units])
        run_chunk(self, task, units)

    monkeypatch.setattr(EndTaskRun, "_run_chunk", spy)
    # room for two of the longest prompts: the longest two share a chunk, the shortest goes alone
    limit = 2 * entries[0]
    capped = Evaluator(
        model, tokenizer, presses, [8], ["aware"], tmp_path / "capped", progress=False, max_batch_tokens=limit
    ).run([task])
    assert chunks == [entries[:2], entries[2:]]
    assert all(len(chunk) * chunk[0] <= limit for chunk in chunks)
    chunks.clear()
    single = Evaluator(
        model, tokenizer, presses, [8], ["aware"], tmp_path / "one", progress=False, batch_size=1
    ).run([task])
    assert chunks == [[n] for n in entries]
    key = lambda row: (row["sample"], row["method"], row["budget"])  # noqa: E731
    assert {key(r): r["answer_ids"] for r in capped} == {key(r): r["answer_ids"] for r in single}
    with pytest.raises(ValueError, match="max_batch_tokens must be positive"):
        Evaluator(model, tokenizer, presses, [8], max_batch_tokens=0)


def test_the_token_cap_follows_the_free_device_memory(tiny_llama, monkeypatch):
    model, _ = tiny_llama
    assert device_batch_tokens(model) is None  # on a CPU: no cap

    class OnCuda(torch.nn.Module):
        """A model whose weights report a CUDA device (nothing runs on it)."""

        def __init__(self) -> None:
            super().__init__()
            self.config = model.config

        def parameters(self, recurse: bool = True):
            weight = torch.zeros(1, dtype=torch.bfloat16)
            weight.__class__ = type("CudaTensor", (torch.Tensor,), {"device": torch.device("cuda", 0)})
            yield weight

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 1 * gib)
    config = model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2  # bf16 K + V
    # half of the free memory, counting what the allocator holds unused (3 - 1 GiB)
    assert device_batch_tokens(OnCuda()) == int(0.5 * 12 * gib / per_token)
