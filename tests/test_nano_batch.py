"""Nano-batches (model/nano_batch.py): the split forward gives the sequential forward's tokens and
logits on the tiny model, its metadata cuts requests into consecutive chunks, and its two streams are
joined wherever one reads what the other wrote."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sarathi_kernels.tolerances import COMPILED_TOLERANCE

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.model.nano_batch import NO_OVERLAP, NanoBatch, OverlapRule, overlapped_layers, split_meta


@pytest.fixture(scope="module")
def llm():
    return LLM(model="tiny", dtype="float32", device="cpu", chunk_size=128, max_batch_size=8,
               max_model_len=512, seed=0)


def test_the_rule_cuts_large_hybrid_batches_at_half_their_gemm_tiles():
    rule = OverlapRule("nano_batch")
    assert rule.cut(512 + 17, 512, 17) == 256  # 5 tiles: 2 + 3
    assert rule.cut(495 + 17, 495, 17) == 256  # 4 tiles: 2 + 2
    assert rule.cut(383, 366, 17) is None  # below min_tokens
    assert rule.cut(1024, 1024, 0) is None  # no decodes: nothing memory-bound to hide
    assert rule.cut(400, 100, 300) == 100  # the first nano-batch holds prefill tokens only
    assert NO_OVERLAP.cut(529, 512, 17) is None


def test_a_bad_overlap_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        EngineConfig(overlap="nano")
    assert str(e.value) == "overlap='nano' is invalid: allowed values are none, nano_batch"
    with pytest.raises(ConfigError, match="simulator runs no nano-batches") as e:
        EngineConfig(overlap="nano_batch", executor="sim")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        EngineConfig(overlap="nano_batch", tensor_parallel=2, device="cpu")
    assert str(e.value) == ("overlap='nano_batch' is invalid with 2 ranks (tensor_parallel x "
                            "pipeline_parallel): they run each batch whole; allowed: none")


prefills = st.lists(st.tuples(st.integers(1, 60), st.integers(0, 120)), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None)
@given(prefills=prefills, decodes=st.integers(1, 5), context=st.integers(2, 200),
       tile=st.sampled_from([4, 8, 16]))
def test_nano_batches_give_the_sequential_forwards_tokens(llm, prefills, decodes, context, tile):
    runner = llm.engine.executor.runner
    with SyntheticBatches(llm, seed=0).made(prefills, decodes, context) as batch:
        runner.overlap = NO_OVERLAP
        whole = runner.forward(runner.prepare(batch)).float()
        runner.overlap = OverlapRule("nano_batch", min_tokens=1, tile=tile)
        try:
            prepared = runner.prepare(batch)
            split = runner.forward(prepared).float()
        finally:
            runner.overlap = NO_OVERLAP
    tokens = sum(c for c, _ in prefills) + decodes
    assert (prepared.nano is not None) == (tokens > tile)
    assert torch.equal(whole.argmax(-1), split.argmax(-1))
    rel = (whole - split).abs().max() / whole.abs().max()
    assert rel <= COMPILED_TOLERANCE[torch.float32]


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=4), decodes=st.integers(0, 4),
       before=st.integers(0, 50), data=st.data())
def test_split_metadata_cuts_a_chunk_into_two_consecutive_chunks(lens, decodes, before, data):
    from sarathi_lab.attention import AttentionMetadata

    q = lens + [1] * decodes
    seqs = [before + n for n in lens] + [before + 7] * decodes
    meta = AttentionMetadata(
        num_prefills=len(lens), num_decodes=decodes, num_prefill_tokens=sum(lens),
        query_start_loc=torch.zeros(len(q) + 1, dtype=torch.int32), seq_lens=torch.tensor(seqs),
        block_tables=torch.arange(len(q))[:, None], slot_mapping=torch.arange(sum(q)), query_lens_host=q,
        seq_lens_host=seqs, max_query_len=max(q))
    at = data.draw(st.integers(1, min(sum(lens), sum(q) - 1))) if sum(q) > 1 else 1
    if sum(q) == 1:
        with pytest.raises(ValueError, match="leaves one nano-batch empty"):
            split_meta(meta, at)
        return
    first, second = split_meta(meta, at)
    assert sum(first.query_lens_host) == at and first.slot_mapping.tolist() == list(range(at))
    assert first.num_prefills + second.num_prefills - len(lens) in (0, 1)  # one request cut, or none
    assert second.num_decodes == decodes and first.num_decodes == 0
    cut = first.block_tables[-1].item() == second.block_tables[0].item()
    if cut:  # the first piece ends where the second starts
        assert first.seq_lens_host[-1] == second.seq_lens_host[0] - second.query_lens_host[0]
    joined = first.query_lens_host[:-1] + [first.query_lens_host[-1] + second.query_lens_host[0]] if cut else \
        first.query_lens_host
    assert joined + second.query_lens_host[cut:] == q
    assert first.seq_lens_host[:-1] + second.seq_lens_host == seqs if cut else \
        first.seq_lens_host + second.seq_lens_host == seqs
    for part in (first, second):
        assert part.query_start_loc.tolist()[-1] == sum(part.query_lens_host)
        assert part.num_prefill_tokens == sum(part.query_lens_host[: part.num_prefills])


class RecordedStreams:
    """A StreamPair that runs in order and keeps, per stream, a vector clock: each op stamped with its
    stream's clock, each wait merging the event's; op a happens before op b where b's stamp has seen a."""

    def __init__(self, drop_waits_on: str = ""):
        self.clock = {"main": {"main": 0, "side": 0}, "side": {"main": 0, "side": 0}}
        self.current, self.ops, self.drop = "main", [], drop_waits_on

    def op(self, name) -> None:
        clock = self.clock[self.current]
        clock[self.current] += 1
        self.ops.append((name, self.current, dict(clock)))

    def mark(self, stream: str):
        return dict(self.clock[stream])

    def wait(self, stream: str, event) -> None:
        if stream != self.drop:
            self.clock[stream] = {s: max(t, event[s]) for s, t in self.clock[stream].items()}

    @contextlib.contextmanager
    def on_side(self):
        self.current = "side"
        yield
        self.current = "main"

    def hand(self, tensor, stream: str) -> None:
        pass

    def before(self, a, b) -> bool:
        """Whether op ``a`` happens before op ``b`` (ops as (name, stream, stamp))."""
        return a[2][a[1]] <= b[2][a[1]] and a is not b


class LoggedLayer:
    """A decoder layer's three stages, each logging itself on the streams' current stream."""

    def __init__(self, index: int, streams: RecordedStreams):
        self.index, self.streams, self.self_attn = index, streams, self

    def pre_attention(self, positions, hidden, residual, kv_cache, meta):
        self.streams.op(("pre", self.index, meta))
        return hidden + 1, hidden if residual is None else residual

    def attend(self, q, kv_cache, meta):
        self.streams.op(("attend", self.index, meta))
        return q * 2

    def post_attention(self, out, residual):
        self.streams.op(("post", self.index, out.shape[0]))
        return out + residual, residual


def _schedule(streams: RecordedStreams, layers: int = 3):
    stack = [LoggedLayer(i, streams) for i in range(layers)]
    parts = (NanoBatch(slice(0, 2), None, 0), NanoBatch(slice(2, None), None, 1))
    hidden, _ = overlapped_layers(stack, torch.arange(5.0)[:, None], [None] * layers, parts, streams)
    streams.op(("read", hidden.shape[0]))
    return {op[0]: op for op in streams.ops}, streams


def _violations(ops: dict, streams: RecordedStreams, layers: int = 3) -> list[str]:
    rows = {0: 2, 1: 3}
    bad = []
    for layer in range(layers):
        for part in (0, 1):
            pre, attend = ops[("pre", layer, part)], ops[("attend", layer, part)]
            if attend[1] != "side" or pre[1] != "main" or not streams.before(pre, attend):
                bad.append(f"attend {layer}/{part} not after its pre on the side stream")
            # Its chunk piece reads the keys the first nano-batch's pre wrote.
            if not streams.before(ops[("pre", layer, 0)], attend):
                bad.append(f"attend {layer}/{part} may run before nano-batch 0's KV write")
    for layer in range(layers):
        for part in (0, 1):
            if not streams.before(ops[("attend", layer, part)], ops[("post", layer, rows[part])]):
                bad.append(f"post of {layer}/{part} may read its attention before it is done")
    read = ops[("read", 5)]
    bad += [f"{name} not joined before the output is read" for name, op in ops.items()
            if op[1] == "side" and not streams.before(op, read)]
    return bad


def test_every_side_stream_op_is_joined_before_its_output_is_read():
    ops, streams = _schedule(RecordedStreams())
    assert _violations(ops, streams) == []
    # And the streams do overlap: nano-batch 0's attention is unordered with nano-batch 1's
    # projections.
    a, b = ops[("attend", 1, 0)], ops[("pre", 1, 1)]
    assert not streams.before(a, b) and not streams.before(b, a)


def test_the_check_finds_a_missing_join():
    ops, streams = _schedule(RecordedStreams(drop_waits_on="main"))
    assert any("not joined" in v for v in _violations(ops, streams))
    ops, streams = _schedule(RecordedStreams(drop_waits_on="side"))
    assert any("not after its pre" in v for v in _violations(ops, streams))


def test_nano_batches_give_the_same_tokens_through_the_triton_attention():
    # The GPU's attention (its interpreter here): a chunk cut in two, and a cut leaving decodes alone.
    llm = LLM(model="tiny", dtype="float32", device="cpu", attention="triton", cpu_linear="aten",
              max_batch_size=8, max_model_len=512, chunk_size=128, warmup_iters=0, seed=0)
    runner = llm.engine.executor.runner
    for prefills, decodes, cut in (([(40, 30), (50, 100)], 5, 48), ([(16, 0)], 7, 16)):
        with SyntheticBatches(llm, seed=0).made(prefills, decodes, 200) as batch:
            whole = runner.forward(runner.prepare(batch)).float()
            runner.overlap = OverlapRule("nano_batch", min_tokens=1, tile=16)
            prepared = runner.prepare(batch)
            split = runner.forward(prepared).float()
            runner.overlap = NO_OVERLAP
        assert prepared.nano[0].meta.num_prefill_tokens == cut
        assert torch.equal(whole.argmax(-1), split.argmax(-1))
        assert (whole - split).abs().max() / whole.abs().max() <= COMPILED_TOLERANCE[torch.float32]


def test_an_op_breakdown_of_a_cut_batch_is_refused_in_one_line(llm):
    # The hooks sync the device at every op, which serialises the two streams: no honest split.
    from sarathi_lab.measure.profiling.ops import time_by_op

    runner, batches = llm.engine.executor.runner, SyntheticBatches(llm, seed=0)
    runner.overlap = OverlapRule("nano_batch", min_tokens=1, tile=16)
    try:
        with batches.made([(40, 0)], 3, 60) as batch, pytest.raises(ConfigError) as e:
            time_by_op(llm, batch, reps=1)
        assert str(e.value).startswith("engine.overlap='nano_batch' is invalid with an op breakdown of a "
                                       "batch it cuts (43 tokens, 3 decodes: nano-batches at token 16)")
        assert "\n" not in str(e.value)
        with batches.made([(40, 0)], 0, 60) as batch:  # prefill alone: never cut, split as before
            ops = time_by_op(llm, batch, reps=1)
        assert ops["attention"] > 0 and ops["total"] > 0
    finally:
        runner.overlap = NO_OVERLAP
