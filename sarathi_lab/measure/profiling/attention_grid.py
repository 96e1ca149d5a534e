"""The attention grid's shapes, metric names and time by arithmetic; torch-free for the plan."""
from __future__ import annotations

from dataclasses import dataclass

# SDPA on its flash backend (the default, as on the CPU), on cuDNN (FA3-class on Hopper) where
# present, and FlexAttention with a block mask.
ENGINE, SDPA, CUDNN, FLEX = "engine", "sdpa_flash", "sdpa_cudnn", "flex"
CONTENDERS = (ENGINE, SDPA, CUDNN, FLEX)
KINDS = ("prefill", "chunk", "decode")

# Estimates until a lease measures them; the first compile also starts Inductor's workers.
FLEX_FIRST_COMPILE_S, FLEX_COMPILE_S, ENGINE_COMPILE_S, SHAPE_S, START_S = 20.0, 4.0, 2.0, 0.2, 10.0


def flex_compile_s(compiles: int) -> float:
    return FLEX_FIRST_COMPILE_S + FLEX_COMPILE_S * (compiles - 1) if compiles else 0.0


@dataclass(frozen=True)
class Case:
    kind: str  # prefill (a whole prompt), chunk (over a cached prefix) or decode
    heads: int
    kv_heads: int
    head_dim: int
    query_len: int     # per request: the prompt, the chunk, or 1
    context: int  # per request, this step's tokens included
    batch: int = 1

    @property
    def prefix(self) -> int:
        return self.context - self.query_len

    @property
    def label(self) -> str:
        """``heads=40/40,c=256,prefix=3072``, ``heads=32/8,prefill=2048`` or
        ``heads=40/40,b=18,ctx=1024``. """
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
        """FlexAttention for chunks over a prefix only: it compiles per shape."""
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
    reps: int
    warmup: int

    def cases(self) -> list[Case]:
        out = []
        for heads, kv_heads in self.heads:
            out += [Case("prefill", heads, kv_heads, self.head_dim, n, n) for n in self.prefills]
            out += [Case("chunk", heads, kv_heads, self.head_dim, c, p + c)
                    for c in self.chunks for p in self.prefixes]
            out += [Case("decode", heads, kv_heads, self.head_dim, 1, n, b)
                    for b in self.decode_batches for n in self.decode_contexts]
        return out

    @property
    def flex_compiles(self) -> int:
        """Static shapes: FlexAttention's fastest kernel."""
        return sum(FLEX in case.peers for case in self.cases())

    def estimate_s(self) -> float:
        """Compiles first (a kernel per GQA group and tiling), then under a second a shape."""
        return (START_S + flex_compile_s(self.flex_compiles)
                + ENGINE_COMPILE_S * 2 * len(self.heads)
                + SHAPE_S * len(self.cases()))


# GPU: LLaMA-13B's heads (MHA) and Mistral-7B's (GQA 32/8) in bf16 at the paper's sizes; CPU (the
# dry run): the same kinds at shapes the interpreter runs in seconds.
GRIDS = {
    "cuda": Grid(heads=((40, 40), (32, 8)), head_dim=128, prefills=(512, 1024, 2048, 4096),
                 chunks=(64, 128, 256, 512), prefixes=(0, 1024, 3072), decode_batches=(1, 18, 64),
                 decode_contexts=(512, 1024, 4096), dtype="bfloat16", reps=20, warmup=3),
    "cpu": Grid(heads=((2, 2), (4, 1)), head_dim=16, prefills=(32,), chunks=(16,), prefixes=(0, 32),
                decode_batches=(1, 3), decode_contexts=(24,), dtype="float32", reps=2, warmup=1),
}

# A chunk over a prefix under CHUNK_FLOOR_PREFIX has a launch floor: shown, no target.
PEER_TARGET = 1.2
FLOOR_TARGET = {"chunk": 2.0, "decode": 1.2}
CHUNK_FLOOR_PREFIX = 1024


def floor_target(kind: str, prefix: int) -> float | None:
    """None where the shape has no target."""
    if kind == "chunk" and prefix < CHUNK_FLOOR_PREFIX:
        return None
    return FLOOR_TARGET.get(kind)
