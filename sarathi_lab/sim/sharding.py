"""One GPU's part of a model split over GPUs, and the links between them, for every cost model."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sarathi_lab.config import AS_WRITTEN, ConfigError, check_count
from sarathi_lab.model.parallel.sharding import TensorShards
from sarathi_lab.model.parallel.stages import Stage
from sarathi_lab.refusal import marked_as

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig


@dataclass(frozen=True)
class Parallelism:
    # A DGX A100's links (docs/sim/README.md, section 2): NVLink ring, InfiniBand HDR between.
    tp: int = 1
    pp: int = 1
    allreduce_bandwidth: float = 240e9
    allreduce_latency_s: float = 10e-6
    p2p_bandwidth: float = 25e9
    p2p_latency_s: float = 5e-6

    def __post_init__(self):
        for key in ("tp", "pp"):
            check_count(f"sim.parallel.{key}", getattr(self, key), 1, AS_WRITTEN)
        # A NaN bandwidth never lets the clock pass a finite time: the run would not end.
        for key in ("allreduce_bandwidth", "allreduce_latency_s", "p2p_bandwidth", "p2p_latency_s"):
            value, bandwidth = getattr(self, key), key.endswith("bandwidth")
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            if not number or not math.isfinite(value) or value < 0 or (bandwidth and value == 0):
                raise ConfigError(f"sim.parallel.{key}", value, "is invalid: must be a finite "
                                  f"number {'> 0' if bandwidth else '>= 0'}", keys=AS_WRITTEN)

    def p2p_s(self, tokens: int, hidden_bytes: int) -> float:
        """One stage's send of a micro-batch's hidden states to the next; none without stages."""
        if self.pp == 1:
            return 0.0
        return self.p2p_latency_s + tokens * hidden_bytes / self.tp / self.p2p_bandwidth


def shard_config(config: ModelConfig, par: Parallelism, model: str = "") -> ModelConfig:
    """The part of ``config`` one GPU runs, by the engine's rule (model/parallel/); a split the
    engine refuses is refused in one line naming sim_tp or sim_pp."""
    with marked_as({"tensor_parallel": "sim_tp", "pipeline_parallel": "sim_pp"}):
        shard = TensorShards.of(config, 0, par.tp, model, pad_vocab=True).local_config(config)
        shard.num_hidden_layers = Stage.of(config.num_hidden_layers, par.pp, 0, model).num_layers
    shard.vocab_size = -(-config.vocab_size // par.tp)
    return shard


def shard(config: ModelConfig, tp: int, pp: int = 1, model: str = "") -> ModelConfig:
    """What one GPU holds of ``config`` split over ``tp`` GPUs in each of ``pp`` stages."""
    return config if tp == pp == 1 else shard_config(config, Parallelism(tp=tp, pp=pp), model)
