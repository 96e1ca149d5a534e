"""The measuring layer's parts: the timer against a clock whose readings are known, the machine
description against what torch detects, hand-built batches and standalone attention metadata."""
from __future__ import annotations

import pytest
import torch

from sarathi_lab import LLM
from sarathi_lab.engine.timer import best_time, median_time, time_calls
from sarathi_lab.host_features import cpu_has_bf16_units, run_dtype
from sarathi_lab.measure.profiling import machine
from sarathi_lab.measure.profiling.attention import context_slot_mapping, paged_batch
from sarathi_lab.measure.profiling.batches import SyntheticBatches


class SteppingClock:
    """Each call of the timed function takes the next of ``durations`` seconds."""

    def __init__(self, durations):
        self.t, self.durations = 0.0, list(durations)

    def now(self) -> float:
        return self.t

    def call(self) -> None:
        self.t += self.durations.pop(0)


def test_timer_skips_warmup_and_takes_the_median_or_the_best():
    clock = SteppingClock([100.0, 3.0, 1.0, 2.0])
    assert time_calls(clock.call, 3, clock, warmup=1) == [3.0, 1.0, 2.0]
    clock = SteppingClock([100.0, 3.0, 1.0, 2.0])
    assert median_time(clock.call, 3, clock) == 2.0
    clock = SteppingClock([100.0, 3.0, 1.0, 2.0])
    assert best_time(clock.call, 3, clock) == 1.0
    flushed = []
    clock = SteppingClock([1.0, 1.0])
    median_time(clock.call, 1, clock, before=lambda: flushed.append(clock.t))
    assert flushed == [1.0], "before() runs after the warm-up, ahead of the timed call, untimed"


def test_machine_flags_agree_with_what_torch_detects():
    flags = machine.cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo here: nothing to cross-check")
    assert cpu_has_bf16_units() == bool({"avx512_bf16", "amx_bf16"} & flags)
    assert torch.backends.cpu.get_cpu_capability() != "AVX512" or "avx512f" in flags
    isa = machine.cpu_isa().split(",")
    assert set(isa) <= set(machine.ISA_FLAGS) and ("avx512_bf16" in isa) == ("avx512_bf16" in flags)
    assert run_dtype("bfloat16", "cpu") == ("bfloat16" if cpu_has_bf16_units() else "float32")


def test_last_level_cache_is_the_highest_level_sysfs_lists(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "491520K"), (1, "64K")]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    assert machine.llc_mib(tmp_path) == 480
    (tmp_path / "index2" / "size").write_text("32M\n")
    (tmp_path / "index4").mkdir()  # a level whose size cannot be read is passed over
    (tmp_path / "index4" / "level").write_text("4\n")
    (tmp_path / "index4" / "size").write_text("garbled\n")
    assert machine.llc_mib(tmp_path) == 32
    assert machine.llc_mib(tmp_path / "absent") is None
    assert machine.machine_record()["llc_mib"] == machine.llc_mib()


def test_paged_batch_writes_each_token_at_its_context_slot():
    torch.manual_seed(0)
    query_lens, seq_lens = [5, 16, 1, 1], [5, 40, 17, 33]
    meta, num_blocks = paged_batch(query_lens, seq_lens, num_prefills=2, block_size=16)
    assert num_blocks == 1 + 1 + 3 + 2 + 3
    context = context_slot_mapping(meta, 16).split(seq_lens)
    new = meta.slot_mapping.split(query_lens)
    for ctx, slots, q in zip(context, new, query_lens):
        assert slots.tolist() == ctx[-q:].tolist()
    # Every slot of every request is distinct, and one block stays unreferenced.
    all_slots = torch.cat(list(context))
    assert all_slots.unique().numel() == all_slots.numel() == sum(seq_lens)
    used = {int(b) for i, s in enumerate(seq_lens) for b in meta.block_tables[i, : -(-s // 16)]}
    assert len(used) == num_blocks - 1
    assert meta.query_lens_host == query_lens and meta.num_prefill_tokens == 21 and meta.num_decodes == 2


def test_synthetic_batches_lay_out_blocks_and_give_them_back():
    llm = LLM("tiny", device="cpu", dtype="float32", num_threads=1, num_kv_blocks=64, warmup_iters=0)
    bs, free = llm.config.block_size, llm.block_manager.num_free
    allocated = SyntheticBatches(llm, seed=1)
    batch = allocated.make(prefills=[(20, 12)], decodes=2, context=3 * bs)
    assert [c.seq.num_computed for c in batch.chunks] == [12, 3 * bs - 1, 3 * bs - 1]
    assert llm.block_manager.num_free == free - 2 - 3 - 3
    allocated.free(batch)
    assert llm.block_manager.num_free == free

    served = SyntheticBatches(llm, seed=1, layout="served")
    assert llm.block_manager.num_free == 0, "a laid-out batch claims the whole cache"
    batch = served.make(prefills=[(2 * bs, 0)], decodes=1, context=8 * bs)
    prefill, decode = (c.seq.block_table for c in batch.chunks)
    assert prefill == list(range(2))  # a prompt allocated at once is one run of blocks
    assert decode[:6] == list(range(2, 8)) and all(b >= 32 for b in decode[6:])  # then decode blocks, scattered
    served.close()
    assert llm.block_manager.num_free == free
