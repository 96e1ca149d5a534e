"""The roofline floor of one iteration: max(bytes / copy bandwidth, flops / matmul rate), the least
time the machine could take, with the bytes and flops ``model.shape.iteration_cost`` counts (weights,
LM head when sampled, embeddings, KV read and written; attention over the causally visible pairs);
and the same floor of one layer's attention alone (``model.shape.attention_cost``)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.model.shape import Shape, attention_cost, iteration_cost


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


def floor(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int, elem_bytes: int,
          copy_gbps: float, matmul_gflops: float) -> Floor:
    flops, nbytes = iteration_cost(shape, query_lens, context_lens, num_sampled, elem_bytes)
    return Floor(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9))


def attention_floor(heads: int, kv_heads: int, head_dim: int, query_lens: list[int], context_lens: list[int],
                    elem_bytes: int, copy_gbps: float, matmul_gflops: float) -> Floor:
    """One layer's attention kernel: its flops at the matmul rate against its keys, values, queries and
    outputs at the copy bandwidth."""
    flops, nbytes = attention_cost(heads, kv_heads, head_dim, query_lens, context_lens, elem_bytes)
    return Floor(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9))
