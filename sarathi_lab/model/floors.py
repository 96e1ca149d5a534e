"""An iteration's floors at measured ceilings: max(bytes / bandwidth, flops / rate) whole (physical)
or per kernel summed (sequential), and one layer's attention's, never below LAUNCH_FLOOR_S."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.model.shape import Shape, attention_cost, iteration_cost, kernel_costs

# One kernel's launch and wait, stated: a prefix-0 chunk's roofline floor is well under it.
LAUNCH_FLOOR_S = 4e-6


@dataclass
class Floor:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    launch_s: float = 0.0

    @classmethod
    def at(cls, flops: float, nbytes: float, copy_gbps: float, matmul_gflops: float,
           launch_s: float = 0.0) -> Floor:
        return cls(flops, nbytes, flops / (matmul_gflops * 1e9), nbytes / (copy_gbps * 1e9),
                   launch_s)

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
    return Floor.at(flops, nbytes, copy_gbps, matmul_gflops)


@dataclass
class SequentialFloor:
    kernels: dict[str, Floor]  # over all layers

    @property
    def seconds(self) -> float:
        return sum(f.seconds for f in self.kernels.values())


def sequential_floor(shape: Shape, query_lens: list[int], context_lens: list[int], num_sampled: int,
                     elem_bytes: int, copy_gbps: float, matmul_gflops: float) -> SequentialFloor:
    costs = kernel_costs(shape, query_lens, context_lens, num_sampled, elem_bytes)
    return SequentialFloor({name: Floor.at(flops, nbytes, copy_gbps, matmul_gflops)
                            for name, (flops, nbytes) in costs.items()})


def attention_floor(heads: int, kv_heads: int, head_dim: int, query_lens: list[int],
                    context_lens: list[int], elem_bytes: int, copy_gbps: float,
                    matmul_gflops: float) -> Floor:
    flops, nbytes = attention_cost(heads, kv_heads, head_dim, query_lens, context_lens, elem_bytes)
    return Floor.at(flops, nbytes, copy_gbps, matmul_gflops, LAUNCH_FLOOR_S)


def memory_ceiling(env: dict) -> tuple[float, str]:
    """A ValueError naming the field where neither is a positive number."""
    for key, which in (("read_gbps", "read"), ("copy_gbps", "copy")):
        value = env.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value), which
    raise ValueError(f"env is invalid: read_gbps={env.get('read_gbps')!r}, "
                     f"copy_gbps={env.get('copy_gbps')!r}; "
                     "need a positive GB/s in one of them")
