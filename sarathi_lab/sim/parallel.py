"""Tensor and pipeline parallelism as the simulator costs them.

Tensor parallelism (Megatron-LM) is a cost scaling: each of the ``tp`` GPUs of a stage holds
1/tp of every layer's heads and MLP columns (and of the LM head's vocabulary), so it runs the
cost model of that shard, plus two all-reduces of the hidden states per layer (after the attention
output projection and after the MLP). By the roofline each is a ring all-reduce,

    allreduce_s = latency + 2 (tp - 1) / tp * tokens * hidden * elem_bytes / allreduce_bandwidth

and the calibrated and profile cost models read it from NCCL times measured where vidur measured
that device and GPU count (all_reduce.py), the roofline elsewhere, saying so in a warning.

Pipeline parallelism splits the layers into ``pp`` stages; a micro-batch's hidden states go from
one stage to the next over the inter-node link, each TP rank sending its 1/tp slice (Megatron's
scatter/gather), ``p2p_s = latency + tokens * hidden * elem_bytes / tp / p2p_bandwidth``.

Link figures, for the SARATHI paper's 64-A100 setting (8 DGX A100 nodes, TP within a node):
- NVLink 3 on A100: 12 links x 25 GB/s = 300 GB/s per direction (NVIDIA A100 datasheet, "600 GB/s"
  bidirectional); ring all-reduce reaches about 80% of it (nccl-tests report about 230-240 GB/s
  bus bandwidth on a DGX A100): 240 GB/s, 10 us per collective launch (assumed).
- InfiniBand HDR, one 200 Gb/s ConnectX-6 per GPU in a DGX A100 (DGX A100 user guide): 25 GB/s,
  5 us (assumed).
The host's per-iteration work is left out: a pipelined engine overlaps it with the stages.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass

from transformers import PretrainedConfig

from sarathi_lab.config import ConfigError, check_count
from sarathi_lab.model.decoder import head_dim_of
from sarathi_lab.sim.all_reduce import AllReduce, ring_s
from sarathi_lab.sim.cost_model import CostModel, IterationCost
from sarathi_lab.sim.device import Device, load_device
from sarathi_lab.sim.roofline import RooflineCostModel


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    allreduce_bandwidth: float = 240e9
    allreduce_latency_s: float = 10e-6
    p2p_bandwidth: float = 25e9
    p2p_latency_s: float = 5e-6

    def __post_init__(self):
        for key in ("tp", "pp"):
            check_count(f"sim.parallel.{key}", getattr(self, key), 1)
        # A NaN bandwidth never lets the simulated clock pass a finite time: the run would not end.
        for key in ("allreduce_bandwidth", "allreduce_latency_s", "p2p_bandwidth", "p2p_latency_s"):
            value, bandwidth = getattr(self, key), key.endswith("bandwidth")
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or value < 0 or (bandwidth and value == 0)):
                raise ConfigError(f"sim.parallel.{key}={value!r} is invalid: must be a finite number "
                                  f"{'> 0' if bandwidth else '>= 0'}")


def shard_config(config: PretrainedConfig, par: Parallelism) -> PretrainedConfig:
    """The part of ``config`` one GPU runs: 1/tp of the heads, MLP and vocabulary, 1/pp of the
    layers. Fails with one line when the model does not split evenly."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    for key, value, parts in (("num_attention_heads", heads, par.tp), ("num_key_value_heads", kv_heads, par.tp),
                              ("intermediate_size", config.intermediate_size, par.tp),
                              ("num_hidden_layers", config.num_hidden_layers, par.pp)):
        if value % parts:
            raise ConfigError(f"model.{key}={value} is invalid with tp={par.tp}, pp={par.pp}: it must split evenly "
                              f"into {parts}")
    shard = copy.deepcopy(config)
    shard.head_dim = head_dim_of(config)
    shard.num_attention_heads, shard.num_key_value_heads = heads // par.tp, kv_heads // par.tp
    shard.intermediate_size //= par.tp
    shard.vocab_size = -(-config.vocab_size // par.tp)
    shard.num_hidden_layers //= par.pp
    return shard


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch: on every stage, on the last stage in addition (the LM head),
    and between two stages."""
    stage_s: float
    last_extra_s: float
    p2p_s: float

    def on(self, stage: int, stages: int) -> float:
        return self.stage_s + (self.last_extra_s if stage == stages - 1 else 0.0)


class StageCostModel:
    """What a micro-batch costs one GPU of a stage, from the roofline of its shard."""

    def __init__(self, device: Device, config: PretrainedConfig, par: Parallelism, dtype: str = "float16"):
        self.par = par
        self.shard = shard_config(config, par)
        self.roofline = RooflineCostModel(device, self.shard, dtype)
        self.hidden_bytes = config.hidden_size * self.roofline.elem_bytes
        self.layers = self.shard.num_hidden_layers

    def allreduce_s(self, tokens: int) -> float:
        p = self.par
        return ring_s(tokens * self.hidden_bytes, p.tp, p.allreduce_latency_s, p.allreduce_bandwidth)

    def times(self, prefills: list[tuple[int, int]], decodes: list[int], num_sampled: int) -> StageTimes:
        cost = self.roofline.iteration_cost(prefills, decodes, num_sampled)
        tokens = sum(c for c, _ in prefills) + len(decodes)
        head = cost.ops["lm_head"]
        p = self.par
        p2p = p.p2p_latency_s + tokens * self.hidden_bytes / p.tp / p.p2p_bandwidth if p.pp > 1 else 0.0
        return StageTimes(stage_s=cost.forward_s - head + 2 * self.layers * self.allreduce_s(tokens),
                          last_extra_s=head, p2p_s=p2p)


class TensorParallelCostModel(CostModel):
    """An iteration on ``tp`` GPUs serving as one (one stage): ``shard``, the cost model of one
    GPU's shard (its LM head included), plus the two all-reduces of each layer; the host's work
    as the shard's (one host drives them all)."""

    def __init__(self, shard: CostModel, config: PretrainedConfig, all_reduce: AllReduce, dtype: str = "bfloat16"):
        super().__init__(config, dtype)
        self.shard = shard
        self.name = shard.name
        self.all_reduce = all_reduce
        self.layers = shard.config.num_hidden_layers
        self.hidden_bytes = config.hidden_size * self.elem_bytes

    @property
    def device(self) -> Device:
        return self.shard.device

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        cost = self.shard._cost(prefills, decodes, num_sampled)
        tokens = sum(c for c, _ in prefills) + len(decodes)
        allreduce = 2 * self.layers * self.all_reduce(tokens * self.hidden_bytes)
        return IterationCost(cost.prepare_s, cost.forward_s + allreduce, cost.sample_s,
                             cost.ops | {"allreduce": allreduce}, cost.extrapolated)


def tensor_parallel_cost_model(device: str, config: PretrainedConfig, cost_model: str, tp: int,
                               dtype: str = "bfloat16") -> TensorParallelCostModel:
    """``tp`` GPUs of ``device`` serving ``config`` as one, by ``cost_model``: the roofline with
    the ring all-reduce; ``calibrated`` the calibrated roofline of the shard; ``profile`` the shard's
    kernels where vidur measured them at this tensor-parallel degree (refused otherwise). Both
    of the latter take the all-reduce measured where it was, and warn where it was not."""
    from sarathi_lab.sim.calibrated import CalibratedRooflineCostModel

    par = Parallelism(tp=tp)
    dev = load_device(device, dtype)
    shard = shard_config(config, par)
    if cost_model == "roofline":
        shard_model: CostModel = RooflineCostModel(dev, shard, dtype)
    elif cost_model == "calibrated":
        shard_model = CalibratedRooflineCostModel(dev, shard, dtype)
    elif cost_model == "profile":
        shard_model = CostModel.measured_kernels(device, config, dtype, tp=tp)
    else:
        raise ConfigError(f"sim_cost_model={cost_model!r} is invalid with sim_tp={tp}: allowed values are "
                          "roofline, calibrated, profile")
    all_reduce = AllReduce.of(device, tp, par.allreduce_latency_s, par.allreduce_bandwidth,
                              measured=cost_model != "roofline")
    if cost_model != "roofline":
        warnings.warn(f"sim_tp={tp} on {device} (sim_cost_model={cost_model!r}): the {all_reduce.describe()}",
                      stacklevel=2)
    return TensorParallelCostModel(shard_model, config, all_reduce, dtype)
