"""The roofline floor of one iteration: the least time the machine could take for it.

An iteration must at least read every weight it multiplies by and every cached key/value its
attention looks at (and write this step's keys/values), and must at least do its flops. With the
measured ceilings (``sarathi_lab.profiling.ceilings``) the floor is

    floor = max(bytes / copy_bandwidth, flops / matmul_rate)

Counted bytes: the decoder layers' weights (once per iteration, whatever the batch), the LM head
when a row is sampled, the embedding rows looked up, the KV cache each request reads (its whole
context, per layer) and the KV written. Activations are not counted: the floor is a lower bound.
Counted flops: 2 per multiply-add of every linear layer on every token, the LM head on the sampled
rows, and attention's QK^T and PV over the causally visible (query, key) pairs only.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from sarathi_lab.model.decoder import head_dim_of


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> Shape:
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                   config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads,
                   head_dim_of(config), config.vocab_size)

    @property
    def layer_linear_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def kv_elems_per_token_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim


@dataclass
class Floor:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def visible_pairs(query_len: int, context_len: int) -> int:
    """(query, key) pairs a causal chunk attends to: row r of the chunk sees context_len - query_len + r + 1 keys."""
    before = context_len - query_len
    return query_len * before + query_len * (query_len + 1) // 2


def iteration_cost(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
                   elem_bytes: int) -> tuple[float, float]:
    """(flops, bytes) of one iteration over requests with these query and context lengths (context
    includes this step's tokens), sampling ``num_sampled`` rows."""
    tokens = sum(query_lens)
    s = shape
    linear_flops = 2 * tokens * s.layer_linear_params * s.layers
    attn_flops = 4 * s.heads * s.head_dim * s.layers * sum(visible_pairs(q, c) for q, c in zip(query_lens, context_lens))
    head_flops = 2 * num_sampled * s.hidden * s.vocab
    weight_bytes = s.layer_linear_params * s.layers * elem_bytes
    weight_bytes += (s.hidden * s.vocab * elem_bytes) if num_sampled else 0
    weight_bytes += tokens * s.hidden * elem_bytes  # embedding rows
    kv = s.kv_elems_per_token_layer * s.layers * elem_bytes
    kv_bytes = kv * (sum(context_lens) + tokens)  # read every context, write this step's keys/values
    return float(linear_flops + attn_flops + head_flops), float(weight_bytes + kv_bytes)


def floor(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int, elem_bytes: int,
          copy_gbps: float, matmul_gflops: float) -> Floor:
    flops, nbytes = iteration_cost(shape, query_lens, context_lens, num_sampled, elem_bytes)
    return Floor(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9))
