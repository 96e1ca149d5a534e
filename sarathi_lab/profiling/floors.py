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

# The shape and its arithmetic live with the model; importable from here, where the floors use them.
from sarathi_lab.model.shape import Shape, iteration_cost, visible_pairs

__all__ = ["Floor", "Shape", "floor", "iteration_cost", "visible_pairs"]


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
