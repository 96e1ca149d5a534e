"""The floors an iteration is held to, at the ceilings a benchmark measured (copy bandwidth, matmul rate):

- the physical floor, max(bytes / copy bandwidth, flops / matmul rate) over the whole iteration, with
  the bytes and flops ``model.shape.iteration_cost`` counts (weights, LM head when sampled, embeddings,
  KV read and written; attention over the causally visible pairs): the least the machine could take,
  reached only where memory-bound and compute-bound work overlap;
- the sequential floor, the sum of each kernel's own max(compute, memory) (``model.shape.kernel_costs``):
  the least kernels run one after another could take;
- one layer's attention alone (``model.shape.attention_cost``), never below LAUNCH_FLOOR_S.

The memory ceiling is the read rate where a lease measured one (a read-only kernel: what a floor of
reads needs), else the copy rate (``memory_ceiling``)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.model.shape import Shape, attention_cost, iteration_cost, kernel_costs

# The least time one kernel takes on a GPU however little it does: its launch and the wait for it to end
# (a few microseconds on an H100/H200, stated, not measured here). A prefix-0 chunk's attention has a
# roofline floor well under it, so its ratio to the roofline says nothing about the kernel.
LAUNCH_FLOOR_S = 4e-6


@dataclass
class Floor:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    launch_s: float = 0.0   # a single kernel's: LAUNCH_FLOOR_S

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s, self.launch_s)

    @property
    def bound(self) -> str:
        if self.launch_s > max(self.compute_s, self.memory_s):
            return "launch"
        return "compute" if self.compute_s >= self.memory_s else "memory"


def floor(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
          elem_bytes: int, copy_gbps: float, matmul_gflops: float) -> Floor:
    flops, nbytes = iteration_cost(shape, query_lens, context_lens, num_sampled, elem_bytes)
    return Floor(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9))


@dataclass
class SequentialFloor:
    kernels: dict[str, Floor]   # each kernel's own floor, over all layers

    @property
    def seconds(self) -> float:
        return sum(f.seconds for f in self.kernels.values())


def sequential_floor(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
                     elem_bytes: int, copy_gbps: float, matmul_gflops: float) -> SequentialFloor:
    costs = kernel_costs(shape, query_lens, context_lens, num_sampled, elem_bytes)
    return SequentialFloor({name: Floor(flops, nbytes, flops / (matmul_gflops * 1e9),
                                        nbytes / (copy_gbps * 1e9))
                            for name, (flops, nbytes) in costs.items()})


def attention_floor(heads: int, kv_heads: int, head_dim: int, query_lens: list[int],
                    context_lens: list[int], elem_bytes: int, copy_gbps: float,
                    matmul_gflops: float) -> Floor:
    """One layer's attention kernel: its flops at the matmul rate against its keys, values, queries and
    outputs at the copy bandwidth, and never below one kernel's LAUNCH_FLOOR_S."""
    flops, nbytes = attention_cost(heads, kv_heads, head_dim, query_lens, context_lens, elem_bytes)
    return Floor(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9),
                 LAUNCH_FLOOR_S)


def memory_ceiling(env: dict) -> tuple[float, str]:
    """(GB/s, which) the floors' memory ceiling: an env step's ``read_gbps`` where it measured one, else
    its ``copy_gbps``; a ValueError naming the field where neither is a positive number."""
    for key, which in (("read_gbps", "read"), ("copy_gbps", "copy")):
        value = env.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value), which
    raise ValueError(f"env is invalid: read_gbps={env.get('read_gbps')!r}, copy_gbps={env.get('copy_gbps')!r}; "
                     "need a positive GB/s in one of them")
