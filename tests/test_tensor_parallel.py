"""Tensor parallelism's pieces without processes: each rank's part of every weight, against the whole
projection it is cut from (column shards joined, row shards summed, GQA's KV head of every query head
kept, replicated where KV heads are fewer than ranks), the refusals, the per-rank memory plan, and the
batch the driver sends, against the runner's own tensors."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.batch import ScheduledBatch, ScheduledChunk
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.model.parallel.sharding import TensorShards, rank_memory_config
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.parallel.wire import decode, encode
from sarathi_lab.model.runner import batch_tensors
from sarathi_lab.model.shape import Shape
from sarathi_lab.plan import plan_engine, probe_host

F64 = torch.float64


def _config(heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=intermediate,
                       num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


@st.composite
def layouts(draw):
    size = draw(st.sampled_from([1, 2, 4, 8]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8, 16) if k % size == 0 or size % k == 0]))
    group = draw(st.integers(1, 3))  # query heads per KV head
    heads = kv * group
    if heads % size:
        heads *= size // kv if size > kv else size
    head_dim, columns, rows = draw(st.sampled_from([2, 4])), draw(st.integers(1, 5)), draw(st.integers(1, 7))
    return size, heads, kv, head_dim, size * columns, size * rows


@settings(max_examples=60, deadline=None)
@given(layout=layouts(), seed=st.integers(0, 2**31))
def test_rank_shards_rebuild_the_whole_layer(layout, seed):
    size, heads, kv, head_dim, intermediate, vocab = layout
    config = _config(heads, kv, head_dim, intermediate, vocab)
    hidden, q, kvs = heads * head_dim, heads * head_dim, kv * head_dim
    gen = torch.Generator().manual_seed(seed)
    w = {name: torch.randn(shape, generator=gen, dtype=F64) for name, shape in {
        "qkv_proj": (q + 2 * kvs, hidden), "o_proj": (hidden, q), "gate_up_proj": (2 * intermediate, hidden),
        "down_proj": (hidden, intermediate), "lm_head": (vocab, hidden)}.items()}
    bias = torch.randn(q + 2 * kvs, generator=gen, dtype=F64)
    x = torch.randn(3, hidden, generator=gen, dtype=F64)
    qkv = x @ w["qkv_proj"].T + bias
    q_all, k_all, v_all = (t.view(3, -1, head_dim) for t in qkv.split([q, kvs, kvs], dim=1))
    gate, up = (x @ w["gate_up_proj"].T).chunk(2, dim=1)
    mlp = (torch.nn.functional.silu(gate) * up) @ w["down_proj"].T
    attn_out = torch.randn(3, q, generator=gen, dtype=F64)  # what attention hands o_proj
    o_sum, mlp_sum, logits = 0, 0, []
    for rank in range(size):
        s = TensorShards.of(config, rank, size)
        local = s.local_config(config)
        assert (local.num_attention_heads, local.head_dim) == (heads // size, head_dim)
        lq, lkv = s.local_heads * head_dim, s.local_kv_heads * head_dim
        part = x @ s.shard("layers.0.self_attn.qkv_proj.weight", w["qkv_proj"]).T + s.shard("x.qkv_proj.bias", bias)
        pq, pk, pv = (t.view(3, -1, head_dim) for t in part.split([lq, lkv, lkv], dim=1))
        group_local = s.local_heads // s.local_kv_heads
        for j in range(s.local_heads):  # each local query head, its global one, and the KV head GQA gives each
            h = s.first_head + j
            # Close, not equal: a product over fewer rows may round its float64 sums differently.
            torch.testing.assert_close(pq[:, j], q_all[:, h])
            torch.testing.assert_close(pk[:, j // group_local], k_all[:, h // (heads // kv)])
            torch.testing.assert_close(pv[:, j // group_local], v_all[:, h // (heads // kv)])
        o_sum = o_sum + attn_out[:, s.q_rows()] @ s.shard("layers.0.self_attn.o_proj.weight", w["o_proj"]).T
        g, u = (x @ s.shard("layers.0.mlp.gate_up_proj.weight", w["gate_up_proj"]).T).chunk(2, dim=1)
        mlp_sum = mlp_sum + (torch.nn.functional.silu(g) * u) @ s.shard("layers.0.mlp.down_proj.weight",
                                                                         w["down_proj"]).T
        logits.append(x @ s.shard("lm_head.weight", w["lm_head"]).T)
        assert torch.equal(s.shard("embed_tokens.weight", w["lm_head"]), w["lm_head"])  # whole on every rank
    torch.testing.assert_close(o_sum, attn_out @ w["o_proj"].T)
    torch.testing.assert_close(mlp_sum, mlp)
    torch.testing.assert_close(torch.cat(logits, dim=1), x @ w["lm_head"].T)


def test_checkpoint_parts_are_cut_as_the_fused_weights_are():
    config = _config(8, 2, 4, 12, 16)
    s = TensorShards.of(config, 3, 4)  # KV heads fewer than ranks: rank 3 holds KV head 1
    q, k, v = (torch.randn(n, 32) for n in (32, 8, 8))
    fused = s.shard("qkv_proj", torch.cat([q, k, v]))
    assert torch.equal(fused, torch.cat([s.shard_part("qkv_proj", i, t) for i, t in enumerate((q, k, v))]))
    assert torch.equal(s.shard_part("qkv_proj", 1, k), k[4:8])
    gate, up = torch.randn(12, 32), torch.randn(12, 32)
    assert torch.equal(s.shard("gate_up_proj", torch.cat([gate, up])),
                       torch.cat([s.shard_part("gate_up_proj", 0, gate), s.shard_part("gate_up_proj", 1, up)]))


@pytest.mark.parametrize(("heads", "kv", "intermediate", "vocab", "size", "names"), [
    (6, 6, 8, 16, 4, "6 attention heads"),
    (8, 8, 6, 16, 4, "6 MLP columns"),
    (8, 8, 8, 18, 4, "18 vocabulary entries"),
    (6, 3, 8, 16, 2, "3 KV heads"),
])
def test_a_model_the_ranks_cannot_split_is_refused_in_one_line(heads, kv, intermediate, vocab, size, names):
    with pytest.raises(ConfigError) as e:
        TensorShards.of(_config(heads, kv, 2, intermediate, vocab), 0, size, "m")
    message = str(e.value)
    assert message.startswith(f"tensor_parallel={size} is invalid for model='m'") and names in message
    assert "\n" not in message


def test_more_ranks_than_devices_or_a_simulator_is_refused(monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 2)
    with pytest.raises(ConfigError, match=r"^tensor_parallel=3 is invalid \(tensor_parallel=3 x pipeline_parallel=1 "
                                          r"ranks\): one rank per device needs 3 cores"):
        probe_host(EngineConfig(device="cpu", tensor_parallel=3))  # the plan's, not the config's
    with pytest.raises(ConfigError, match=r"^pipeline_parallel=2 is invalid \(tensor_parallel=2 x pipeline_parallel=2 "
                                          r"ranks\): one rank per device needs 4 cores"):
        probe_host(EngineConfig(device="cpu", tensor_parallel=2, pipeline_parallel=2))
    with pytest.raises(ConfigError, match=r"^pipeline_parallel=2 is invalid with executor='sim'"):
        EngineConfig(executor="sim", pipeline_parallel=2)
    # Under torchrun, the ranks on this node count: 4 ranks over two nodes of 2 cores each fit.
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert probe_host(EngineConfig(device="cpu", tensor_parallel=4)).cores == 2
    with pytest.raises(ConfigError, match=r"^tensor_parallel=2 is invalid with executor='sim'"):
        EngineConfig(executor="sim", tensor_parallel=2)


def test_each_rank_plans_for_its_own_kv_heads_and_weights(monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 4)
    whole = Shape.of(LlamaConfig(**_config(8, 4, 16, 64, 32).to_dict()))
    for size in (2, 4):
        rank = Shape.of(rank_memory_config(_config(8, 4, 16, 64, 32), size))
        assert rank.kv_bytes_per_token(2) * size == whole.kv_bytes_per_token(2)
        assert rank.weight_bytes(2) < whole.weight_bytes(2)
    # The same memory budget holds twice the blocks where each rank caches half the KV heads.
    one = plan_engine(EngineConfig(model="tiny", device="cpu", dtype="float32", kv_cache_gb=0.01))
    two = plan_engine(EngineConfig(model="tiny", device="cpu", dtype="float32", kv_cache_gb=0.01, tensor_parallel=2))
    assert two.num_kv_blocks in (2 * one.num_kv_blocks, 2 * one.num_kv_blocks + 1)  # each rounded down


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), requests=st.integers(1, 6), decode_only=st.booleans())
def test_the_wire_batch_is_the_runners_batch(seed, requests, decode_only):
    rng = random.Random(seed)
    bs, free = 4, list(range(500))
    rng.shuffle(free)
    batch = ScheduledBatch()
    for i in range(requests):
        seq = Sequence(i, [rng.randrange(100) for _ in range(rng.randint(2, 30))], 4)
        last = len(seq.tokens) - 1
        seq.num_computed = last if decode_only else rng.randint(0, last)
        n = 1 if decode_only else rng.randint(1, len(seq.tokens) - seq.num_computed)
        seq.block_table = [free.pop() for _ in range(-(-(seq.num_computed + n) // bs))]
        if seq.num_computed == last:
            batch.decodes.append(seq)
        else:
            batch.prefills.append(ScheduledChunk(seq, n))
    want = batch_tensors(batch, bs, torch.device("cpu"))
    sent = encode(want)
    got = decode(sent.header.tolist(), sent.payload.clone(), torch.device("cpu"))
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping"):
        assert torch.equal(getattr(got.meta, name), getattr(want.meta, name)), name
    for name in ("num_prefills", "num_decodes", "num_prefill_tokens", "max_query_len", "query_lens_host",
                 "seq_lens_host"):
        assert getattr(got.meta, name) == getattr(want.meta, name), name
    assert sent.header.dtype == torch.int64 and sent.payload.dtype == torch.uint8


def test_the_two_gpu_capacity_overlay_composes_for_gpus_and_for_a_cpu_dry_run():
    from sarathi_lab.harness.cli_check import compose_config
    from sarathi_lab.harness.schema import parse_config

    gpus = compose_config(["experiment=capacity_yi34b_tp2"])
    assert (gpus.model.name, gpus.device.name, gpus.engine.tensor_parallel, gpus.engine.executor) == \
        ("yi-34b", "cuda", 2, "model")
    run = parse_config(compose_config(["experiment=capacity_yi34b_tp2", "model=tiny", "device=cpu", "dtype=float32"]))
    assert (run.engine.tensor_parallel, run.engine.sim_tp, run.engine.executor, run.task) == (2, 1, "model", "capacity")


@given(layers=st.integers(1, 80), count=st.integers(1, 16))
def test_stages_hold_every_layer_once_in_order_as_evenly_as_they_split(layers, count):
    if count > layers:
        with pytest.raises(ConfigError, match=rf"^pipeline_parallel={count} is invalid for model='m': it has "):
            Stage.of(layers, count, 0, "m")
        return
    stages = [Stage.of(layers, count, i) for i in range(count)]
    assert [s.first for s in stages] == [0] + [s.last for s in stages[:-1]] and stages[-1].last == layers
    assert max(s.num_layers for s in stages) - min(s.num_layers for s in stages) <= 1
    assert stages[0].num_layers == max(s.num_layers for s in stages)  # the memory plan sizes by stage 0
    assert stages[0].is_first and stages[-1].is_last and (count == 1) == stages[0].is_last


def test_a_stage_names_its_own_layers_from_zero_and_keeps_the_rest_of_the_model():
    stage = Stage.of(10, 3, 1)  # layers 4..6
    assert (stage.first, stage.last) == (4, 7)
    assert stage.local_name("layers.4.mlp.down_proj.weight") == "layers.0.mlp.down_proj.weight"
    assert stage.local_name("layers.6.self_attn.qkv_proj.bias") == "layers.2.self_attn.qkv_proj.bias"
    assert stage.local_name("layers.3.mlp.down_proj.weight") is None
    assert stage.local_name("layers.7.input_layernorm.weight") is None
    assert stage.local_name("embed_tokens.weight") == "embed_tokens.weight"
