"""An iteration's library floor (the best kernel a lease timed for each part, one after another):
which targets no engine built from these kernels can reach; never extrapolated past what was timed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from sarathi_lab.analysis.gpu_records import invalid
from sarathi_lab.analysis.gpu_tables import COUNT, MS, TEXT, read_table
from sarathi_lab.model.cuda_graphs import graph_sizes, token_buckets
from sarathi_lab.model.shape import Shape

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
WITH_ACTIVATION = "+silu_mul"


def padded_tokens(tokens: int, largest: int, max_batch: int, decode_only: bool = False) -> int:
    """The tokens of the graph replaying an iteration of ``tokens``; eager: ``tokens``."""
    sizes = graph_sizes(max_batch) if decode_only else token_buckets(largest)
    return next((b for b in sizes if b >= tokens), tokens)


def interpolate(points: dict[float, float], x: float) -> float | None:
    xs = sorted(k for k, v in points.items() if v is not None and not math.isnan(v))
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    lo = max(k for k in xs if k <= x)
    hi = min(k for k in xs if k >= x)
    if lo == hi:
        return points[lo]
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


@dataclass(frozen=True)
class GemmCurve:
    """cuBLAS's ms for one layer's projections by token count, as the tune step timed them."""
    layer_ms: dict[int, float]
    with_activation: bool  # gate_up timed with its SiLU x up

    def ms(self, tokens: int) -> float | None:
        return interpolate(self.layer_ms, tokens)

    @property
    def measured(self) -> str:
        if not self.layer_ms:
            return "no tokens"
        return f"{min(self.layer_ms):,}-{max(self.layer_ms):,} tokens"


# tune_gemm.csv's columns read; a candidate that failed (its error said) has no time.
GEMM_COLUMNS = {"model": TEXT, "candidate": TEXT, "error": TEXT, "projection": TEXT, "key": TEXT,
                "m": COUNT, "ms": MS}


def gemm_curve(tune_gemm: Path, model: str) -> GemmCurve:
    """The sum of the four projections at each token count where all four were timed."""
    by_m: dict[int, dict[str, float]] = {}
    with_activation = False
    for row in read_table(tune_gemm, GEMM_COLUMNS, rows_read=lambda r: (
            r["model"] == model and r["candidate"] == "cublas" and not r["error"])):
        by_m.setdefault(row["m"], {})[row["projection"]] = row["ms"]
        with_activation |= (row["projection"] == "gate_up_proj"
                            and row["key"].endswith(WITH_ACTIVATION))
    return GemmCurve({m: sum(p.values()) for m, p in by_m.items() if set(PROJECTIONS) <= p.keys()},
                     with_activation)


@dataclass(frozen=True)
class AttentionTable:
    """One layer's ms per column (engine, best peer) for one head shape."""
    chunk: dict[str, dict[tuple[int, int], float]]
    decode: dict[str, dict[tuple[int, int], float]]

    def chunk_ms(self, column: str, query_len: int, prefix: int) -> float | None:
        return _bilinear(self.chunk.get(column, {}), query_len, prefix)

    def decode_ms(self, column: str, batch: int, context: int) -> float | None:
        return _bilinear(self.decode.get(column, {}), batch, context)


def _bilinear(grid: dict[tuple[int, int], float], x: int, y: int) -> float | None:
    """None where x or y lies outside what was measured."""
    rows = {}
    for gx in {k[0] for k in grid}:
        rows[gx] = interpolate({gy: v for (kx, gy), v in grid.items() if kx == gx}, y)
    return interpolate({k: v for k, v in rows.items() if v is not None}, x)


# attention.csv's columns read; an empty time: that kernel failed or was not run on the shape.
ATTENTION_COLUMNS = {"kind": TEXT, "heads": COUNT, "kv_heads": COUNT, "batch": COUNT,
                     "query_len": COUNT, "context": COUNT, "engine_ms": MS, "best_peer_ms": MS}
ATTENTION_UNMEASURED = frozenset({"engine_ms", "best_peer_ms"})


def attention_table(attention_csv: Path, heads: int, kv_heads: int) -> AttentionTable:
    chunk: dict[str, dict] = {"engine": {}, "best_peer": {}}
    decode: dict[str, dict] = {"engine": {}, "best_peer": {}}
    for row in read_table(attention_csv, ATTENTION_COLUMNS, ATTENTION_UNMEASURED):
        if (row["heads"], row["kv_heads"]) != (heads, kv_heads):
            continue
        query, context, batch = row["query_len"], row["context"], row["batch"]
        if context < query:
            raise invalid(str(attention_csv), f"{row['kind']} at query_len {query}, context",
                          context, f"a context of at least its query's {query} tokens")
        for column in ("engine", "best_peer"):
            if (value := row[f"{column}_ms"]) is None:
                continue
            if row["kind"] == "chunk":
                chunk[column][(query, context - query)] = value
            elif row["kind"] == "decode":
                decode[column][(batch, context)] = value
    return AttentionTable(chunk, decode)


@dataclass
class LibraryFloor:
    """ms over all layers; ``missing``: the parts the lease cannot give here, and why."""
    gemm_ms: float | None
    chunk_attention_ms: float | None
    decode_attention_ms: float | None
    elementwise_ms: float
    head_and_embedding_ms: float
    missing: list[str] = field(default_factory=list)

    @property
    def ms(self) -> float | None:
        parts = (self.gemm_ms, self.chunk_attention_ms, self.decode_attention_ms)
        if any(p is None for p in parts):
            return None
        return sum(parts) + self.elementwise_ms + self.head_and_embedding_ms


def elementwise_ms(shape: Shape, tokens: int, elem_bytes: int, gbps: float,
                   activation_in_gemm: bool) -> float:
    """The activation left out where the GEMM timing holds it."""
    parts = shape.elementwise_bytes_per_token(elem_bytes)
    nbytes = sum(v for k, v in parts.items() if not (activation_in_gemm and k == "activation"))
    return nbytes * tokens * shape.layers / (gbps * 1e9) * 1e3


def library_floor(shape: Shape, chunk: int, decodes: int, context: int, tokens: int,
                  elem_bytes: int, gbps: float, gemms: GemmCurve, attention: AttentionTable,
                  head_and_embedding_ms: float) -> LibraryFloor:
    """A chunk ending a ``context``-token prompt beside ``decodes``; GEMMs over ``tokens`` rows."""
    missing, layers = [], shape.layers
    gemm = gemms.ms(tokens)
    if gemm is None:
        missing.append(f"cuBLAS at {tokens} tokens (tune_gemm.csv timed {gemms.measured})")
    chunk_ms = attention.chunk_ms("best_peer", chunk, context - chunk) if chunk else 0.0
    if chunk_ms is None:
        missing.append(f"the best peer's attention at c={chunk} over a {context - chunk}-token "
                       "prefix (outside attention.csv's shapes)")
    decode_ms = attention.decode_ms("engine", decodes, context) if decodes else 0.0
    if decode_ms is None:
        missing.append(f"the engine's decode attention at b={decodes}, context {context} (outside "
                       f"attention.csv's)")
    return LibraryFloor(*(None if ms is None else ms * layers
                          for ms in (gemm, chunk_ms, decode_ms)),
                        elementwise_ms(shape, tokens, elem_bytes, gbps, gemms.with_activation),
                        head_and_embedding_ms, missing)
