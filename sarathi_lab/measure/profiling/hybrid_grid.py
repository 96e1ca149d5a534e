"""The hybrid batches at which co-scheduled attention (pod_attention.py) is timed against the
engine's sequential kernels and the peers, their metric names, and the grid's time by arithmetic.
Torch-free: the suite's plan reads the estimate."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.measure.profiling.attention_grid import FLEX, SDPA, flex_compile_s

# pod: prefill and decode on separate programs of each SM, each claiming a lane; pod_by_program:
# lane = program id (what the claim is worth); pod_x1: one lane an SM, the control for co-residence;
# engine_*: paged_attention over the whole batch, or the chunk then the decodes.
POD, POD_BY_PROGRAM, POD_X1 = "pod", "pod_by_program", "pod_x1"
ONE_LAUNCH, TWO_LAUNCHES = "engine_one_launch", "engine_two_launches"
SEQUENTIAL = (ONE_LAUNCH, TWO_LAUNCHES)
PEERS = (SDPA, FLEX)
CONTENDERS = (POD, POD_BY_PROGRAM, POD_X1, *SEQUENTIAL, *PEERS)
# The target, at every shape of the GPU grid.
TARGET = 0.8

# Estimates until a lease measures them (the step records each shape's first calls).
KERNEL_COMPILES_S, SHAPE_S, START_S = 10.0, 0.5, 10.0


@dataclass(frozen=True)
class HybridCase:
    heads: int
    kv_heads: int
    head_dim: int
    chunk: int  # the last ``chunk`` tokens of a prompt of ``context``
    decodes: int
    context: int

    @property
    def label(self) -> str:
        """``heads=40/40,c=256,b=16,ctx=1024``: the suite's metric key."""
        return (f"heads={self.heads}/{self.kv_heads},c={self.chunk},b={self.decodes},"
                f"ctx={self.context}")

    @property
    def query_lens(self) -> list[int]:
        return [self.chunk] + [1] * self.decodes

    @property
    def context_lens(self) -> list[int]:
        return [self.context] * (self.decodes + 1)


@dataclass(frozen=True)
class HybridGrid:
    heads: tuple[tuple[int, int], ...]
    head_dim: int
    chunks: tuple[int, ...]
    decodes: tuple[int, ...]
    contexts: tuple[int, ...]
    dtype: str
    reps: int
    warmup: int

    def cases(self) -> list[HybridCase]:
        return [HybridCase(h, kvh, self.head_dim, c, b, ctx) for h, kvh in self.heads
                for c in self.chunks for b in self.decodes for ctx in self.contexts if c <= ctx]

    @property
    def flex_compiles(self) -> int:
        """Once per chunk shape (heads, chunk, context); the decodes go to SDPA."""
        return len({(c.heads, c.kv_heads, c.chunk, c.context) for c in self.cases()})

    def estimate_s(self) -> float:
        return (START_S + flex_compile_s(self.flex_compiles) + KERNEL_COMPILES_S * len(self.heads)
                + SHAPE_S * len(self.cases()))


# GPU: LLaMA-13B's and Mistral-7B's heads, bf16; CPU (dry run): interpreter-sized shapes.
GRIDS = {
    "cuda": HybridGrid(heads=((40, 40), (32, 8)), head_dim=128, chunks=(256, 512), decodes=(16, 32),
                       contexts=(1024, 3072), dtype="bfloat16", reps=20, warmup=3),
    "cpu": HybridGrid(heads=((2, 2), (4, 1)), head_dim=16, chunks=(16,), decodes=(3,),
                      contexts=(24,), dtype="float32", reps=2, warmup=1),
}
