"""The shapes at which the engine's attention is timed against its peers (``attention_peers``), their
names in the GPU suite's metrics, which peer runs where, and the time the whole grid takes by
arithmetic. Torch-free: the suite's plan reads the estimate without importing torch."""
from __future__ import annotations

from dataclasses import dataclass

# The peers, as the metrics name them: PyTorch's scaled_dot_product_attention on its flash backend
# (the default backend where there is none, as on the CPU), the same on its cuDNN backend (FA3-class
# on Hopper; where the device has it) and FlexAttention with a block mask.
ENGINE, SDPA, CUDNN, FLEX = "engine", "sdpa_flash", "sdpa_cudnn", "flex"
CONTENDERS = (ENGINE, SDPA, CUDNN, FLEX)
KINDS = ("prefill", "chunk", "decode")

# What one FlexAttention compile costs (Dynamo, Inductor and one Triton kernel; the first also
# starts Inductor's compile workers), what the engine's Triton kernel costs per specialisation, and
# per shape its inputs, the float32 reference and the timed calls: estimates until a lease measures
# them (the step records flex_compile_s).
FLEX_FIRST_COMPILE_S, FLEX_COMPILE_S, ENGINE_COMPILE_S, SHAPE_S, START_S = 20.0, 4.0, 2.0, 0.2, 10.0


def flex_compile_s(compiles: int) -> float:
    """Seconds of ``compiles`` FlexAttention compiles, the first of which also starts Inductor's workers."""
    return FLEX_FIRST_COMPILE_S + FLEX_COMPILE_S * (compiles - 1) if compiles else 0.0


@dataclass(frozen=True)
class Case:
    kind: str          # prefill (a whole prompt), chunk (over a cached prefix) or decode (a batch of them)
    heads: int
    kv_heads: int
    head_dim: int
    query_len: int     # per request: the prompt, the chunk, or 1
    context: int       # per request, this step's tokens included
    batch: int = 1

    @property
    def prefix(self) -> int:
        return self.context - self.query_len

    @property
    def label(self) -> str:
        """How the suite's metrics name the shape: ``heads=40/40,c=256,prefix=3072``,
        ``heads=32/8,prefill=2048`` or ``heads=40/40,b=18,ctx=1024``."""
        heads = f"heads={self.heads}/{self.kv_heads}"
        if self.kind == "prefill":
            return f"{heads},prefill={self.query_len}"
        if self.kind == "chunk":
            return f"{heads},c={self.query_len},prefix={self.prefix}"
        return f"{heads},b={self.batch},ctx={self.context}"

    @property
    def query_lens(self) -> list[int]:
        return [self.query_len] * self.batch

    @property
    def context_lens(self) -> list[int]:
        return [self.context] * self.batch

    @property
    def peers(self) -> tuple[str, ...]:
        """SDPA's flash and cuDNN kernels everywhere (whole prefills causal, chunks bottom-right causal,
        decodes unmasked); FlexAttention for a chunk over a cached prefix, the case it is built for. A
        chunk at prefix 0 is a whole prefill, SDPA's own case; FlexAttention compiles once per shape, and
        the decodes' 18 more compiles do not fit the step's two minutes (Grid.flex_compiles)."""
        return (SDPA, CUDNN, FLEX) if self.kind == "chunk" and self.prefix > 0 else (SDPA, CUDNN)


@dataclass(frozen=True)
class Grid:
    heads: tuple[tuple[int, int], ...]   # (query heads, KV heads)
    head_dim: int
    prefills: tuple[int, ...]
    chunks: tuple[int, ...]
    prefixes: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    dtype: str
    reps: int                            # timed rounds, every contender once a round
    warmup: int

    def cases(self) -> list[Case]:
        out = []
        for heads, kv_heads in self.heads:
            out += [Case("prefill", heads, kv_heads, self.head_dim, n, n) for n in self.prefills]
            out += [Case("chunk", heads, kv_heads, self.head_dim, c, p + c) for c in self.chunks for p in self.prefixes]
            out += [Case("decode", heads, kv_heads, self.head_dim, 1, n, b)
                    for b in self.decode_batches for n in self.decode_contexts]
        return out

    @property
    def flex_compiles(self) -> int:
        """FlexAttention compiles once per shape it runs (static shapes, its fastest kernel)."""
        return sum(FLEX in case.peers for case in self.cases())

    def estimate_s(self) -> float:
        """Seconds the step takes on a GPU: compiles first (the engine's kernel specialises per GQA group and
        per tiling, decode or prefill tiles), then a fraction of a second a shape."""
        return (START_S + flex_compile_s(self.flex_compiles)
                + ENGINE_COMPILE_S * 2 * len(self.heads)
                + SHAPE_S * len(self.cases()))


# GPU: LLaMA-13B's heads (40 x 128, multi-head) and Mistral-7B's (32 query / 8 KV heads x 128), in
# bf16; whole prefills 512-4096, chunks 64-512 over no prefix, 1K and 3K (the paper's chunk sizes and
# lengths), decode batches of 1, the paper's 18 and 64 at 512-4K. CPU (the dry run): the same kinds
# at shapes the Triton interpreter runs in seconds, MHA and a GQA group of 4 as on the GPU.
GRIDS = {
    "cuda": Grid(heads=((40, 40), (32, 8)), head_dim=128, prefills=(512, 1024, 2048, 4096),
                 chunks=(64, 128, 256, 512), prefixes=(0, 1024, 3072), decode_batches=(1, 18, 64),
                 decode_contexts=(512, 1024, 4096), dtype="bfloat16", reps=20, warmup=3),
    "cpu": Grid(heads=((2, 2), (4, 1)), head_dim=16, prefills=(32,), chunks=(16,), prefixes=(0, 32),
                decode_batches=(1, 3), decode_contexts=(24,), dtype="float32", reps=2, warmup=1),
}

# The targets (on a GPU): within 1.2x of the faster peer at every prefill and chunk shape, a chunk
# over a prefix of CHUNK_FLOOR_PREFIX tokens or more within 2x of its floor, a decode batch within
# 1.2x of its floor (its KV bytes). A chunk over a shorter prefix has a floor of microseconds (the
# launch floor, profiling.floors.LAUNCH_FLOOR_S, at prefix 0): shown, with no target.
PEER_TARGET = 1.2
FLOOR_TARGET = {"chunk": 2.0, "decode": 1.2}
CHUNK_FLOOR_PREFIX = 1024


def floor_target(kind: str, prefix: int) -> float | None:
    """What a shape's attention_over_floor must reach; None where it has no target."""
    if kind == "chunk" and prefix < CHUNK_FLOOR_PREFIX:
        return None
    return FLOOR_TARGET.get(kind)
