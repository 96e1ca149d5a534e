"""The roofline's efficiencies fitted to measured GPU kernels (docs/sim/README.md, section 8)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sarathi_lab.config import AS_WRITTEN, ConfigError
from sarathi_lab.model.shape import Shape, visible_pairs
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.interpolate import isotonic, up_to_point

if TYPE_CHECKING:
    import pandas as pd

POINTWISE_KINDS = ("norm", "rope", "act", "add", "embedding")
# vidur's grid: every 8 up to 1024.
FINE_GRID = 8
KIND_OF_OP = {"input_norm": "norm", "post_attention_norm": "norm", "rope": "rope", "act": "act",
              "add": "add", "embedding": "embedding"}


def check_keys(cls, raw: dict, where: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", why="is not a known key; known keys: "
                          f"{', '.join(sorted(known))}", keys=AS_WRITTEN)


def measured_shape(model: str) -> Shape:
    """vidur's table's shape, else a preset's (a GPU lease's models)."""
    if model in gpu_kernels.model_shapes().index:
        return Shape.of(gpu_kernels.config_of(model))
    from sarathi_lab.model import load_config

    return Shape.of(load_config(model))


def pointwise_elems(kind: str, s: Shape) -> int:
    """Elements a pointwise kernel moves per token and layer."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {"norm": 2 * s.hidden, "rope": 2 * (q + kv),
            "act": (3 if s.gated else 2) * s.intermediate,
            # phi-2's parallel block adds attention, MLP and residual in one kernel.
            "add": (3 if s.gated else 4) * s.hidden, "embedding": 2 * s.hidden}[kind]


def _relative_lstsq(features: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Least squares on the relative error."""
    a = features / t[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    if (coef < 0).any():
        keep = coef >= 0
        coef = np.zeros_like(coef)
        coef[keep], *_ = np.linalg.lstsq(a[:, keep], np.ones(len(t)), rcond=None)
    return np.clip(coef, 0.0, None)


@dataclass(frozen=True)
class Calibration:
    """Lists are the curves' points."""
    gemm_tokens: tuple[int, ...]
    gemm_efficiency: tuple[float, ...]
    gemm_launch_s: tuple[float, ...]
    # kind -> (launch seconds, share of bandwidth)
    pointwise: dict[str, tuple[float, float]]
    prefill_launch_s: float = 0.0
    prefill_per_query_s: float = 0.0
    prefill_efficiency: float = 0.0
    # The query block the measured prefill attention pads a chunk to (the fit's best).
    prefill_tile: int = 128
    decode_launch_s: float = 0.0
    decode_per_request_s: float = 0.0
    decode_bandwidth_efficiency: float = 0.0
    fitted_from: tuple[str, ...] = field(default=())

    def __post_init__(self):
        n = len(self.gemm_tokens)
        if n != len(self.gemm_efficiency) or n != len(self.gemm_launch_s):
            raise ConfigError("sim.device.calibration.gemm_tokens",
                              why=f"has {len(self.gemm_tokens)} points but gemm_efficiency "
                              f"{len(self.gemm_efficiency)} and gemm_launch_s "
                              f"{len(self.gemm_launch_s)}: they must match", keys=AS_WRITTEN)
        unknown = sorted(set(self.pointwise) - set(POINTWISE_KINDS))
        if unknown:
            raise ConfigError(f"sim.device.calibration.pointwise.{unknown[0]}",
                              why=f"is not a known kind; known: {', '.join(POINTWISE_KINDS)}",
                              keys=AS_WRITTEN)
        values = [*self.gemm_efficiency, *(e for _, e in self.pointwise.values())]
        if any(not 0 < v <= 1.5 for v in values):
            raise ConfigError("sim.device.calibration",
                              why=f": an efficiency {min(values)}..{max(values)} is invalid: must "
                              "lie in (0, 1.5]", keys=AS_WRITTEN)

    @property
    def has_attention(self) -> bool:
        return self.prefill_efficiency > 0 and self.decode_bandwidth_efficiency > 0

    def gemm_s(self, tokens: int, k: int, n: int, peak_flops: float) -> float:
        at = up_to_point(self.gemm_tokens, tokens, FINE_GRID)
        eff = float(np.interp(at, self.gemm_tokens, self.gemm_efficiency))
        launch = float(np.interp(at, self.gemm_tokens, self.gemm_launch_s))
        return launch + 2 * at * k * n / (peak_flops * eff)

    @classmethod
    def from_dict(cls, raw: dict, where: str = "sim.device.calibration") -> Calibration:
        check_keys(cls, raw, where)
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        raw["pointwise"] = {k: tuple(v) for k, v in raw.get("pointwise", {}).items()}
        return cls(**raw)


def fit_gemm(table: pd.DataFrame, peak_flops: float) -> tuple[list[int], list[float], list[float]]:
    rows = []
    for model, per_model in table[table.op.isin(gpu_kernels.GEMM_OPS)].groupby("model"):
        kn = measured_shape(model).gemms
        rows.append(per_model.assign(weights=[kn[op][0] * kn[op][1] for op in per_model.op]))
    import pandas as pd
    rows = pd.concat(rows)
    tokens = sorted(set.intersection(*(set(g.tokens) for _, g in rows.groupby("model"))))
    fits = []
    for t in tokens:
        at = rows[rows.tokens == t]
        fits.append(_relative_lstsq(np.column_stack([np.ones(len(at)), at.weights.to_numpy(float)]),
                                    at.seconds.to_numpy(float)))
    launch, per_weight = (isotonic([float(f[i]) for f in fits]) for i in (0, 1))
    eff = [2 * t / (peak_flops * b) for t, b in zip(tokens, per_weight)]
    return tokens, eff, launch


def fit_pointwise(table: pd.DataFrame, bandwidth: float,
                  elem_bytes: int) -> dict[str, tuple[float, float]]:
    out = {}
    rows = table[table.op.isin(list(KIND_OF_OP))].assign(kind=lambda r: r.op.map(KIND_OF_OP))
    for kind, at in rows.groupby("kind"):
        per_model = {m: pointwise_elems(kind, measured_shape(m)) * elem_bytes
                     for m in set(at.model)}
        per_token = at.model.map(per_model).to_numpy(float)
        launch, per_byte = _relative_lstsq(np.column_stack([np.ones(len(at)),
                                                            at.tokens.to_numpy(float) * per_token]),
                                           at.seconds.to_numpy(float))
        out[kind] = (float(launch), float(1 / (bandwidth * per_byte)) if per_byte > 0 else 1.0)
    return out


def ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def attention_flops(per_pair: int, chunk: int, context: int, tile: int) -> float:
    return per_pair * visible_pairs(chunk, context) * ceil_to(chunk, tile) / chunk


PREFILL_TILES = (16, 32, 64, 128)
ATTENTION_FIELDS = ("prefill_launch_s", "prefill_per_query_s", "prefill_efficiency", "prefill_tile",
                    "decode_launch_s", "decode_per_request_s", "decode_bandwidth_efficiency")


def fit_prefill_attention(rows: pd.DataFrame, shape: Shape, peak_flops: float):
    """``launch + padded_chunk * per_query + flops / (peak * eff)``; the query tile fitted best."""
    best = None
    t = rows.seconds.to_numpy(float)
    for tile in PREFILL_TILES:
        padded = np.array([ceil_to(c, tile) for c in rows.tokens], float)
        flops = np.array([attention_flops(shape.attention_flops_per_pair, c, x, tile)
                          for c, x in zip(rows.tokens, rows.context)])
        features = np.column_stack([np.ones(len(rows)), padded, flops])
        coef = _relative_lstsq(features, t)
        err = float(np.median(np.abs(features @ coef / t - 1)))
        if best is None or err < best[0]:
            best = (err, coef, tile)
    _, (launch, per_query, per_flop), tile = best
    return float(launch), float(per_query), _share(peak_flops, per_flop), int(tile)


def _share(peak: float, per_unit: float) -> float:
    """The share of ``peak`` a fitted time per flop (or byte) reaches, at most 1."""
    return float(min(1.0, 1 / (peak * per_unit))) if per_unit > 0 else 1.0


def fit_decode_attention(rows: pd.DataFrame, shape: Shape, bandwidth: float, elem_bytes: int):
    kv_bytes = (shape.kv_bytes_per_token(elem_bytes, layers=1) * rows.batch.to_numpy(float)
                * rows.context.to_numpy(float))
    a, per_request, per_byte = _relative_lstsq(
        np.column_stack([np.ones(len(rows)), rows.batch.to_numpy(float), kv_bytes]),
        rows.seconds.to_numpy(float))
    return float(a), float(per_request), _share(bandwidth, per_byte)


def fit_attention(table: pd.DataFrame, peak_flops: float, bandwidth: float) -> dict:
    """ATTENTION_FIELDS from the first model (by name) with both attentions measured; {}: none."""
    for model, rows in table.groupby("model"):
        pre, dec = rows[rows.op == "prefill_attention"], rows[rows.op == "decode_attention"]
        if len(pre) and len(dec):
            shape = measured_shape(model)
            return dict(zip(ATTENTION_FIELDS, (*fit_prefill_attention(pre, shape, peak_flops),
                                               *fit_decode_attention(dec, shape, bandwidth, 2))))
    return {}


def fit(device, exclude=(), attention_from: tuple[Calibration, float] | None = None) -> Calibration:
    """Without attention measured, ``attention_from`` lends it, scaled by GEMM rates."""
    names = [m for m in gpu_kernels.measured(device.name) if m not in exclude]
    if not names:
        raise ValueError(f"no measured models left on {device.name} to fit")
    import pandas as pd
    table = pd.concat([gpu_kernels.kernels(device.name, m).assign(model=m) for m in names],
                      ignore_index=True)
    tokens, eff, launch = fit_gemm(table, device.peak_flops)
    kw = fit_attention(table, device.peak_flops, device.memory_bandwidth)
    if not kw and attention_from is not None and attention_from[0].has_attention:
        attention_from, from_peak = attention_from
        scale = eff[-1] / attention_from.gemm_efficiency[-1]
        kw = {f: getattr(attention_from, f) for f in ATTENTION_FIELDS} | {
            "prefill_per_query_s": attention_from.prefill_per_query_s * from_peak
            / (scale * device.peak_flops),
            "prefill_efficiency": min(1.0, attention_from.prefill_efficiency * scale)}
    return Calibration(gemm_tokens=tuple(tokens), gemm_efficiency=tuple(eff),
                       gemm_launch_s=tuple(launch),
                       pointwise=fit_pointwise(table, device.memory_bandwidth, 2), **kw,
                       fitted_from=tuple(names))


def fit_lease(base: Calibration, table: pd.DataFrame, peak_flops: float, bandwidth: float,
              lease: str) -> Calibration:
    """The lease's GEMM curve (in its range) and attention; pointwise kernels stay the base's."""
    tokens, eff, launch = fit_gemm(table, peak_flops)
    base_points = list(zip(base.gemm_tokens, base.gemm_efficiency, base.gemm_launch_s))
    points = sorted([p for p in base_points if not tokens[0] <= p[0] <= tokens[-1]]
                    + list(zip(tokens, eff, launch)))
    # Where the two curves meet, time per weight and launch never fall with more tokens.
    per_weight = np.maximum.accumulate([t / e for t, e, _ in points])
    launch_s = np.maximum.accumulate([la for _, _, la in points])
    return dataclasses.replace(
        base, gemm_tokens=tuple(int(t) for t, _, _ in points),
        gemm_efficiency=tuple(float(t / w) for (t, _, _), w in zip(points, per_weight)),
        gemm_launch_s=tuple(float(x) for x in launch_s),
        **fit_attention(table, peak_flops, bandwidth),
        fitted_from=(*base.fitted_from, lease))
