"""How a model is split over GPUs (tensor parallel over heads and MLP, pipeline over layers), and the
links between them: what one GPU's part of a model is, for the KV plan and for every cost model."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sarathi_lab.config import ConfigError, check_count
from sarathi_lab.model.shape import head_dim_of, kv_heads_of

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig


@dataclass(frozen=True)
class Parallelism:
    # A DGX A100's links (docs/sim/README.md, section 2): NVLink's ring all-reduce, InfiniBand HDR
    # between nodes.
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

    def p2p_s(self, tokens: int, hidden_bytes: int) -> float:
        """One stage's send of a micro-batch's hidden states to the next (each of its ``tp`` GPUs sends
        its part); none without stages."""
        return self.p2p_latency_s + tokens * hidden_bytes / self.tp / self.p2p_bandwidth if self.pp > 1 else 0.0


def shard_config(config: ModelConfig, par: Parallelism) -> ModelConfig:
    """The part of ``config`` one GPU runs: 1/tp of the heads, MLP and vocabulary, 1/pp of the
    layers. Fails with one line when the model does not split evenly."""
    heads, kv_heads = config.num_attention_heads, kv_heads_of(config)
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


def shard(config: ModelConfig, tp: int, pp: int = 1) -> ModelConfig:
    """What one GPU holds of ``config`` split over ``tp`` tensor-parallel GPUs in each of ``pp`` stages:
    its heads and MLP columns of its stage's layers (``config`` itself for one GPU). Its weights (the
    embedding and LM head counted on every stage, as each keeps them) and its KV per token follow from
    its shape (model/shape.py)."""
    return config if tp == pp == 1 else shard_config(config, Parallelism(tp=tp, pp=pp))
