"""Tensor and pipeline parallelism as the simulator costs them (Megatron-LM): two all-reduces a
layer, NCCL-measured where vidur measured them, else a ring's roofline. Link figures:
docs/sim/README.md."""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.sim.cost_model import (
    ANALYTIC,
    PIPELINE,
    TENSOR_PARALLEL,
    CostModel,
    IterationCost,
    batch_tokens,
    register_cost_model,
)
from sarathi_lab.sim.gpu_kernels import DATA_DIR
from sarathi_lab.sim.interpolate import Curve
from sarathi_lab.sim.sharding import Parallelism

if TYPE_CHECKING:
    import pandas as pd

    from sarathi_lab.model.spec import ModelConfig


@functools.cache
def measured_table() -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(DATA_DIR / "all_reduce.csv")


def measured_points(device: str, tp: int) -> dict[int, float]:
    """{message bytes: seconds} for ``tp`` GPUs of ``device`` in one node ({} if none)."""
    t = measured_table()
    rows = t[(t.device == device) & (t.tp == tp)]
    return dict(zip(rows["bytes"].astype(int), rows.seconds.astype(float)))


def ring_s(nbytes: float, tp: int, latency_s: float, bandwidth: float) -> float:
    return latency_s + 2 * (tp - 1) / tp * nbytes / bandwidth if tp > 1 else 0.0


@dataclass(frozen=True)
class AllReduce:
    """Measured at ``points`` (beyond, plus the ring's extra bytes), else the ring's roofline."""
    tp: int
    latency_s: float
    bandwidth: float
    points: tuple[tuple[int, float], ...] = ()
    source: str = ""

    @functools.cached_property
    def curve(self) -> Curve | None:
        return Curve(dict(self.points)) if self.points else None

    def roofline_s(self, nbytes: float) -> float:
        return ring_s(nbytes, self.tp, self.latency_s, self.bandwidth)

    def __call__(self, nbytes: float) -> float:
        if self.tp == 1:
            return 0.0
        c = self.curve
        if c is None:
            return self.roofline_s(nbytes)
        if nbytes > c.xs[-1]:
            return c.ys[-1] + self.roofline_s(nbytes) - self.roofline_s(c.xs[-1])
        return c(max(nbytes, c.xs[0]))[0]

    def describe(self) -> str:
        if self.curve is None:
            return (f"all-reduce of {self.tp} GPUs: the ring roofline ({self.latency_s * 1e6:g} us "
                    f"+ {self.bandwidth / 1e9:g} GB/s){': ' + self.source if self.source else ''}")
        return (f"all-reduce of {self.tp} GPUs: measured ({self.source}) up to "
                f"{self.curve.xs[-1] / 2**20:g} "
                "MiB a message, the ring roofline's extra bytes beyond")


@dataclass(frozen=True)
class StageTimes:
    """Seconds of one micro-batch on each stage. Host terms are 0 (overlapped) unless measured on a
    running pipeline: ``stage_host_s``, work a stage cannot overlap with its previous micro-batch;
    ``receive_s``, taking the activations in (a message over the socket's buffer moves only while
    read); ``first_host_s``, stage 0's where it differs (None: the same)."""
    stage_s: float
    last_extra_s: float
    p2p_s: float
    host_s: float = 0.0
    sample_s: float = 0.0
    stage_host_s: float = 0.0
    return_s: float = 0.0
    after_s: float = 0.0
    receive_s: float = 0.0
    first_host_s: float | None = None
    # Each stage's layers over the first's where they do not split evenly; () where they do.
    layer_share: tuple[float, ...] = ()

    def on(self, stage: int, stages: int) -> float:
        layers_s = self.stage_s * self.layer_share[stage] if self.layer_share else self.stage_s
        return layers_s + (self.last_extra_s if stage == stages - 1 else 0.0)

    @classmethod
    def of(cls, cost: IterationCost, p2p_s: float, allreduce_s: float = 0.0, host_s: float = 0.0,
           sample_s: float = 0.0) -> StageTimes:
        """``allreduce_s``: where ``cost`` lacks them; the LM head on the last stage only."""
        head = cost.ops.get("lm_head", 0.0)
        return cls(stage_s=cost.forward_s - head + allreduce_s, last_extra_s=head, p2p_s=p2p_s,
                   host_s=host_s, sample_s=sample_s)


def through_stages(times: StageTimes, now: float, stage_free: list[float],
                   busy: list[float]) -> tuple[list[float], list[float]]:
    """One micro-batch through the stages: each stage's begin and end."""
    # Stage 0's host work is its bubble, as measured; later stages take commands in transit.
    first_host = times.stage_host_s if times.first_host_s is None else times.first_host_s
    ready, stages = now + times.host_s + first_host, len(stage_free)
    begins, ends = [], []
    for s in range(stages):
        if s:
            begin = max(stage_free[s] + times.stage_host_s, ready) + times.receive_s
        else:
            begin = max(stage_free[0], ready)
        dt = times.on(s, stages)
        busy[s] += dt
        stage_free[s] = begin + dt + (times.after_s if s else 0.0)
        begins.append(begin)
        ends.append(begin + dt)
        ready = begin + dt + times.p2p_s
    return begins, ends


@register_cost_model(TENSOR_PARALLEL)
class TensorParallelCostModel(CostModel):
    """``tp`` GPUs as one stage: the shard plus two all-reduces a layer."""

    def __init__(self, shard: CostModel, config: ModelConfig, tp: int, dtype: str = "bfloat16"):
        super().__init__(config, dtype)
        self.shard, self.name, self.device = shard, shard.name, shard.device
        par, device = Parallelism(tp=tp), shard.device.name
        measured = self.name not in ANALYTIC and tp > 1
        points = tuple(sorted(measured_points(device, tp).items())) if measured else ()
        source = (f"vidur, {device.upper()} DGX node, NCCL" if points
                  else f"no all-reduce measured for {tp} x {device}" if measured else "")
        self.all_reduce = AllReduce(tp, par.allreduce_latency_s, par.allreduce_bandwidth, points,
                                    source)
        if self.name not in ANALYTIC:
            warnings.warn(f"sim_tp={tp} on {device} (sim_cost_model={self.name!r}): the "
                          f"{self.all_reduce.describe()}", stacklevel=3)
        self.layers = shard.config.num_hidden_layers
        self.hidden_bytes = config.hidden_size * self.elem_bytes

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        cost = self.shard._cost(prefills, decodes, num_sampled)
        tokens = batch_tokens(prefills, decodes)
        allreduce = 2 * self.layers * self.all_reduce(tokens * self.hidden_bytes)
        return IterationCost(cost.prepare_s, cost.forward_s + allreduce, cost.sample_s,
                             cost.ops | {"allreduce": allreduce}, cost.extrapolated)


@register_cost_model(PIPELINE)
class PipelineCostModel(CostModel):
    """An iteration: one micro-batch through an empty pipeline, which a TBT budget is held to."""

    def __init__(self, stage: CostModel, config: ModelConfig, tp: int, pp: int,
                 dtype: str = "bfloat16"):
        super().__init__(config, dtype)
        self.stage, self.name, self.device = stage, stage.name, stage.device
        self.par = Parallelism(tp=tp, pp=pp)
        self.stages = pp
        self.hidden_bytes = config.hidden_size * self.elem_bytes
        layers = [Stage.of(config.num_hidden_layers, pp, s).num_layers for s in range(pp)]
        self.layer_share = () if len(set(layers)) == 1 else tuple(n / layers[0] for n in layers)

    def times(self, prefills: list[tuple[int, int]], decodes: list[int],
              num_sampled: int) -> StageTimes:
        cost = self.stage.iteration_cost(prefills, decodes, num_sampled)
        p2p = self.par.p2p_s(batch_tokens(prefills, decodes), self.hidden_bytes)
        return replace(StageTimes.of(cost, p2p, host_s=cost.prepare_s, sample_s=cost.sample_s),
                       layer_share=self.layer_share)

    def _cost(self, prefills, decodes, num_sampled) -> IterationCost:
        times, stages = self.times(prefills, decodes, num_sampled), self.stages
        _, ends = through_stages(times, 0.0, [0.0] * stages, [0.0] * stages)
        forward, sends = ends[-1] - times.host_s, (stages - 1) * times.p2p_s
        return IterationCost(times.host_s, forward, times.sample_s,
                             {"stages": forward - sends, "p2p": sends})


@dataclass(frozen=True)
class HostOverlapped:
    """``cost``'s stages with the driver's host step before stage 0 taken as overlapped (0)."""
    cost: PipelineCostModel

    @property
    def stages(self) -> int:
        return self.cost.stages

    def times(self, prefills: list[tuple[int, int]], decodes: list[int],
              num_sampled: int) -> StageTimes:
        return replace(self.cost.times(prefills, decodes, num_sampled), host_s=0.0)
