"""Predicted against measured GPU kernels, per operator and iteration kind, for the roofline, the
calibrated roofline and its hold-out fit (docs/sim/README.md, section 5)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from sarathi_lab.measure.sim_check import point_table
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.calibration import (
    ATTENTION_FIELDS,
    Calibration,
    fit,
    fit_prefill_attention,
    measured_shape,
)
from sarathi_lab.sim.device import GPU_DEVICES, load_device
from sarathi_lab.sim.parallel import AllReduce, measured_table
from sarathi_lab.sim.roofline import CalibratedRooflineCostModel, RooflineCostModel
from sarathi_lab.sim.sharding import Parallelism, shard

OP_TOKENS = (1, 8, 32, 64, 128, 136, 256, 264, 512, 1024, 2048, 4096)
DECODE_CONTEXT = 1089  # every measured batch size has a decode row here
# kind -> (chunks as (chunk, context cached), decodes): the measured shapes.
ITERATIONS = {
    **{f"decode b={b}": ([], b) for b in (1, 4, 16, 32, 64, 128)},
    **{f"prefill {c}@{x}": ([(c, x)], 0) for c, x in ((112, 112), (288, 288), (512, 512),
                                                      (1024, 1024), (512, 2048), (1024, 3072))},
    **{f"hybrid {c}@{x}+{b}": ([(c, x)], b) for c, x, b in ((512, 1536, 8), (512, 1536, 32),
                                                            (112, 1136, 64))},
}
MODELS = ("roofline", "calibrated", "holdout")
# A table's error columns (<model>_<suffix>) -> point_table.summary's key.
ERRORS = {"median_err": "median_abs_rel_err", "worst_err": "worst_abs_rel_err"}
# vidur's measurements, shipped under its MIT licence (sim/data/gpu_kernels/README.md).
VIDUR = "the vidur project's measured"


def compare(device: str, model: str, cal: Calibration, held_out: Calibration,
            op_tokens=OP_TOKENS, iterations=ITERATIONS,
            tp: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-op rows, per-iteration rows); ``tp`` > 1: a shard the calibration never saw."""
    curves, prefill, decode = gpu_kernels.curves(gpu_kernels.kernels(device, model, tp))
    has_attention = prefill is not None and decode is not None
    config = shard(gpu_kernels.config_of(model), tp)
    shape = Shape.of(config)
    dev = load_device(device)
    cms = {"roofline": RooflineCostModel(dev, config)} | {
        name: CalibratedRooflineCostModel(dataclasses.replace(dev, calibration=c), config)
        for name, c in (("calibrated", cal), ("holdout", held_out))}

    def op_s(op: str, tokens: int) -> float:
        return curves[op](tokens)[0] if op in curves else 0.0

    def measured_ops(tokens: int) -> dict[str, float]:
        pointwise = sum(op_s(op, tokens) for op in gpu_kernels.POINTWISE_OPS)
        return {op: op_s(op, tokens) for op in gpu_kernels.GEMM_OPS} | {
            "pointwise": pointwise, "embedding": op_s("embedding", tokens)}

    def predicted_ops(cm: RooflineCostModel, tokens: int) -> dict[str, float]:
        """Named as measured, pointwise summed."""
        return {op: cm.gemm_s(tokens, k, n) for op, (k, n) in shape.gemms.items()} | {
            "pointwise": cm.pointwise_s(tokens), "embedding": cm.embedding_s(tokens)}

    def measured_iteration(prefills, decodes: int) -> float:
        ops = measured_ops(sum(c for c, _ in prefills) + decodes)
        total = shape.layers * sum(v for k, v in ops.items() if k != "embedding") + ops["embedding"]
        if not has_attention:
            return total
        return total + shape.layers * (sum(prefill(c, x - c)[0] for c, x in prefills)
                                       + (decode(decodes, DECODE_CONTEXT)[0] if decodes else 0.0))

    def predicted_iteration(cm: RooflineCostModel, prefills, decodes: int) -> float:
        # The measured kernels hold no LM head.
        ops = cm.iteration_cost(prefills, [DECODE_CONTEXT] * decodes, 0).ops
        return sum(v for k, v in ops.items() if has_attention or k not in gpu_kernels.ATTENTION_OPS)

    max_tokens = max(c.xs[-1] for c in curves.values())
    ops_rows = []
    for t in (t for t in op_tokens if t <= max_tokens):
        predicted = {name: predicted_ops(cm, t) for name, cm in cms.items()}
        for op, value in measured_ops(t).items():
            ops_rows.append({"device": device, "model": model, "tp": tp, "op": op, "tokens": t,
                             "measured_s": value}
                            | {f"{name}_s": predicted[name][op] for name in cms})
    it_rows = [{"device": device, "model": model, "tp": tp, "iteration": name,
                "kind": name.split(" ")[0], "attention": has_attention,
                "measured_s": measured_iteration(prefills, decodes)}
               | {f"{cm_name}_s": predicted_iteration(cm, prefills, decodes)
                  for cm_name, cm in cms.items()}
               for name, (prefills, decodes) in iterations.items()]
    return pd.DataFrame(ops_rows), pd.DataFrame(it_rows)


def run(devices=None, models=None, op_tokens=OP_TOKENS,
        tp: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``tp`` > 1: each GPU's shard, predicted by calibrations fitted to unsharded kernels only."""
    pairs = []
    calibrations = {d: load_device(d).calibration for d in gpu_kernels.measured_devices()
                    if d in GPU_DEVICES}
    for device in devices or [d for d, cal in calibrations.items() if cal is not None]:
        full, measured = calibrations.get(device), gpu_kernels.measured(device, tp)
        for model in [m for m in models or measured if m in measured]:
            # Fitted without the model it predicts; attention from the full fit (one model).
            held = dataclasses.replace(fit(load_device(device), exclude=(model,)),
                                       **{f: getattr(full, f) for f in ATTENTION_FIELDS})
            pairs.append(compare(device, model, full, held, op_tokens, tp=tp))
    if not pairs:
        return pd.DataFrame(), pd.DataFrame()
    return tuple(pd.concat(frames, ignore_index=True) for frames in zip(*pairs))


def errors(iterations: pd.DataFrame) -> pd.DataFrame:
    """|predicted / measured - 1| per device, model and iteration kind, median and worst."""
    keys = ["device", "model", "kind", "tp"]
    return point_table.per_model(point_table.from_wide(iterations, VIDUR, MODELS, keys), keys,
                                 (ERRORS,))


def attention_holdout(device: str = "a100", model: str = "llama2-7b") -> pd.DataFrame:
    """Prefill attention fitted without one chunk size, predicting it."""
    dev = load_device(device)
    t = gpu_kernels.kernels(device, model)
    pre = t[t.op == "prefill_attention"]
    shape = measured_shape(model)
    found = []
    for chunk in sorted(pre.tokens.unique()):
        launch, per_query, eff, tile = fit_prefill_attention(pre[pre.tokens != chunk], shape,
                                                             dev.peak_flops)
        cal = dataclasses.replace(dev.calibration, prefill_launch_s=launch,
                                  prefill_per_query_s=per_query, prefill_efficiency=eff,
                                  prefill_tile=tile)
        cm = CalibratedRooflineCostModel(dataclasses.replace(dev, calibration=cal),
                                         gpu_kernels.config_of(model))
        held = pre[pre.tokens == chunk]
        found.append(held.assign(device=device, model=model, chunk=int(chunk), kind=held.op,
                                 measured_s=held.seconds,
                                 holdout_s=[cm.prefill_attention_s(c, x)
                                            for c, x in zip(held.tokens, held.context)]))
    keys = ["device", "model", "chunk"]
    table = point_table.summarize(point_table.from_wide(
        pd.concat(found), f"{VIDUR} {device} attention", ["holdout"], keys), keys)
    return table[[*keys, "points", *ERRORS.values()]].rename(
        columns={stat: suffix for suffix, stat in ERRORS.items()})


def all_reduce(devices=None, tps=None) -> pd.DataFrame:
    """Measured all-reduces beside the ring roofline, the measured table, and its hold-out."""
    par = Parallelism()
    t = measured_table()
    rows = []
    for (device, tp), g in t.groupby(["device", "tp"]):
        if (devices and device not in devices) or (tps and tp not in tps):
            continue
        sizes = tuple(zip(g["bytes"].astype(int), g.seconds.astype(float)))
        table = AllReduce(int(tp), par.allreduce_latency_s, par.allreduce_bandwidth, sizes)
        for i, (nbytes, seconds) in enumerate(sizes):
            held = AllReduce(int(tp), par.allreduce_latency_s, par.allreduce_bandwidth, sizes[:i]
                             + sizes[i + 1:])
            rows.append({"device": device, "tp": int(tp), "bytes": nbytes, "measured_s": seconds,
                         "roofline_s": table.roofline_s(nbytes), "calibrated_s": table(nbytes),
                         "holdout_s": held(nbytes)})
    return pd.DataFrame(rows)


def all_reduce_errors(rows: pd.DataFrame) -> pd.DataFrame:
    band = np.where(rows["bytes"] < 2**20, "< 1 MiB", ">= 1 MiB")
    keys = ["device", "tp", "band"]
    found = point_table.from_wide(rows.assign(band=band), f"{VIDUR} all-reduces", MODELS, keys,
                                  kind="all_reduce")
    return point_table.per_model(found, keys, (ERRORS,), count="sizes")
