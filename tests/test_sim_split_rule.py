"""The simulator splits a model as the engine does (model/parallel/): for any heads, KV heads, layers,
tp and pp, one simulated GPU holds what one of the engine's ranks holds (heads, KV heads replicated
where fewer than ranks, MLP columns, its stage's layers), and refuses exactly the splits the engine
refuses."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.config import ConfigError
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.model.spec import ModelSpec
from sarathi_lab.sim import build as sim_build
from sarathi_lab.sim.sharding import shard

HEAD_DIM = 8


def _model(heads: int, kv_heads: int, layers: int) -> ModelSpec:
    return ModelSpec("llama", heads * HEAD_DIM, 96, layers, heads, kv_heads, 480, 512)


def _engine_rank(config: ModelSpec, tp: int, pp: int) -> tuple[int, int, int, int] | None:
    """(heads, KV heads, MLP columns, layers) of the engine's rank 0 from the rows its loader keeps of
    each weight and its stage's layers; None where the engine refuses the split."""
    try:
        shards = TensorShards.of(config, 0, tp)
        stages = [Stage.of(config.num_hidden_layers, pp, s) for s in range(pp)]
    except ConfigError:
        return None
    assert sum(s.num_layers for s in stages) == config.num_hidden_layers
    q, kv, mlp = (len(range(1 << 20)[rows]) for rows in
                  (shards.q_rows(), shards.kv_rows(), shards.mlp_rows()))
    return q // HEAD_DIM, kv // HEAD_DIM, mlp, max(s.num_layers for s in stages)


@settings(max_examples=300, deadline=None)
@given(heads=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32]), kv_div=st.sampled_from([1, 2, 3, 4, 8]),
       layers=st.integers(1, 13), tp=st.sampled_from([1, 2, 3, 4, 8]), pp=st.integers(1, 5))
def test_one_simulated_gpu_holds_what_one_engine_rank_holds(heads, kv_div, layers, tp, pp):
    kv = max(heads // kv_div, 1)
    config = _model(heads, kv if heads % kv == 0 else heads, layers)
    engine = _engine_rank(config, tp, pp)
    try:
        part = shard(config, tp, pp)
    except ConfigError:
        assert engine is None
        return
    assert engine is not None
    assert (part.num_attention_heads, part.num_key_value_heads, part.intermediate_size,
            part.num_hidden_layers) == engine
    assert part.head_dim == HEAD_DIM


def test_splits_the_simulator_refused_and_the_engine_runs_are_simulated():
    # LLaMA-2-7B over three stages (11, 11, 10 layers) and Mistral-7B's 8 KV heads over 16 GPUs.
    assert shard(_model(32, 32, 32), 1, 3).num_hidden_layers == 11
    sixteen = shard(_model(32, 8, 32), 16)
    assert (sixteen.num_attention_heads, sixteen.num_key_value_heads) == (2, 1)
    assert sim_build.shard is shard  # the KV plan splits by the same function


def test_a_stage_of_fewer_layers_takes_its_share_of_the_first_stage_s_time():
    from sarathi_lab.sim import CostModel

    three = CostModel.for_device("a100", "llama2-7b", "roofline", "float16", pp=3)
    times = three.times([(256, 256)], [512] * 4, 5)
    assert times.layer_share == (1.0, 1.0, 10 / 11)
    assert times.on(0, 3) == times.on(1, 3) == times.stage_s
    assert times.on(2, 3) - times.last_extra_s == pytest.approx(times.stage_s * 10 / 11, rel=1e-12)
    # Stages that split evenly are priced as before: every one the same.
    assert CostModel.for_device("a100", "llama2-7b", "roofline", "float16", pp=2).times(
        [(256, 256)], [], 1).layer_share == ()
