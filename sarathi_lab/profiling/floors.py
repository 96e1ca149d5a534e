"""The roofline floor of one iteration: max(bytes / copy bandwidth, flops / matmul rate), the least
time the machine could take, with the bytes and flops ``model.shape.iteration_cost`` counts (weights,
LM head when sampled, embeddings, KV read and written; attention over the causally visible pairs)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.model.shape import Shape, iteration_cost


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
