"""The GPU cost models held against this engine's own operator tables measured on a GPU by
``task=profile``, per operator and iteration kind (docs/sim/README.md, section 5c). These time this
engine, host launches included, not the hardware's tight kernels."""
from __future__ import annotations

import dataclasses
import warnings

import pandas as pd

from sarathi_lab.measure.sim_check import fidelity, point_table
from sarathi_lab.model import PRESETS, load_config
from sarathi_lab.sim.cost_model import batch_tokens
from sarathi_lab.sim.device import GPU_DEVICES, load_device
from sarathi_lab.sim.profile_model import DENSE_OPS, ProfileCostModel, measured_iterations
from sarathi_lab.sim.profiles import profile_description, profile_path, profiled_devices
from sarathi_lab.sim.roofline import CalibratedRooflineCostModel, RooflineCostModel

# A device without a calibration is also held against that of the device whose compute it shares, on
# its own peaks: a labelled variant, not a fit.
BORROWED_CALIBRATION = {"h200": "h100"}
# Where the forward's arithmetic, not its launches, should set the time.
LARGE_PREFILL = 256
SOURCE = "this engine's profile measured on a GPU (task=profile)"


def profiled(devices=None) -> list[tuple[str, str]]:
    """(device, model) of every committed engine profile on a simulated GPU."""
    return [(device, model) for device, model in profiled_devices()
            if device in GPU_DEVICES and model in PRESETS
            and (devices is None or device in devices)]


def cost_models(device: str, config, dtype: str) -> dict[str, RooflineCostModel]:
    dev = load_device(device, dtype)
    cms = {"roofline": RooflineCostModel(dev, config, dtype)}
    if dev.calibration is not None:
        cms["calibrated"] = CalibratedRooflineCostModel(dev, config, dtype)
    elif device in BORROWED_CALIBRATION:
        other = BORROWED_CALIBRATION[device]
        borrowed = dataclasses.replace(dev, calibration=load_device(other, dtype).calibration)
        cms[f"{other}_calibration"] = CalibratedRooflineCostModel(borrowed, config, dtype)
    return cms


def as_engine_times(cm: RooflineCostModel, ops: dict[str, float], tokens: int) -> dict[str, float]:
    """Regrouped as the engine times them (measure/profiling/ops.py)."""
    part = {kind: cm.shape.layers * s for kind, s in cm.pointwise_parts_s(tokens).items()}
    return {"qkv_proj": ops["qkv_proj"], "o_proj": ops["o_proj"],
            "ffn": ops["gate_up_proj"] + part["act"] + ops["down_proj"],
            "others": ops["pointwise"] - part["act"] - part["rope"] + ops["lm_head"],
            "attention": ops["prefill_attention"] + ops["decode_attention"] + part["rope"]}


def compare(device: str, model: str, table: pd.DataFrame, dtype: str = "bfloat16"
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Whole-model seconds; ``profile_s``: the profile cost model on this same table."""
    config = load_config(model)
    cms = cost_models(device, config, dtype)
    ops = []
    for row in table.itertuples():
        t, x, b = int(row.tokens), int(row.context), int(row.batch)
        # A dense op's iteration is a whole prompt; an attention's, its chunk or decode batch.
        name, prefills, decodes = {"prefill_attention": ("attention", [(t, x)], []),
                                   "decode_attention": ("attention", [], [x] * b)
                                   }.get(row.op, (row.op, [(t, t)], []))
        if row.op not in (*DENSE_OPS, "prefill_attention", "decode_attention"):
            continue
        tokens = batch_tokens(prefills, decodes)
        ops.append({"device": device, "model": model, "op": row.op, "tokens": t, "context": x,
                    "batch": b, "measured_s": float(row.seconds)}
                   | {f"{n}_s": as_engine_times(cm, cm.iteration_cost(prefills, decodes).ops,
                                                tokens)[name]
                      for n, cm in cms.items()})
    # The profile model on this table shows what composing ops costs; its past-chunk warning off.
    its = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cms["profile"] = ProfileCostModel(table, config, dtype, source=f"{device}/{model}")
        for kind, prefills, decodes, seconds in measured_iterations(table):
            chunk = prefills[0][0] if prefills else 0
            context = decodes[0] if decodes else chunk
            label = {"prefill": f"prefill {chunk}", "decode": f"decode b={len(decodes)} @{context}",
                     "hybrid": f"hybrid {chunk} + b={len(decodes)} @{context}"}[kind]
            its.append({"device": device, "model": model, "iteration": label, "kind": kind,
                        "tokens": chunk + len(decodes), "context": context, "batch": len(prefills)
                        + len(decodes), "measured_s": seconds}
                       | {f"{n}_s": cm.iteration_cost(prefills, decodes).forward_s
                          for n, cm in cms.items()})
    return pd.DataFrame(ops), pd.DataFrame(its)


def run(devices=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    pairs = []
    for device, model in profiled(devices):
        path = profile_path(device, model)
        dtype = profile_description(path).get("engine", {}).get("torch_dtype", "bfloat16")
        pairs.append(compare(device, model, pd.read_csv(path), dtype))
    if not pairs:
        return pd.DataFrame(), pd.DataFrame()
    return tuple(pd.concat(frames, ignore_index=True) for frames in zip(*pairs))


def models_in(rows: pd.DataFrame) -> list[str]:
    return [c.removesuffix("_s") for c in rows if c.endswith("_s") and c != "measured_s"
            and rows[c].notna().all()]


def errors(ops: pd.DataFrame, iterations: pd.DataFrame) -> pd.DataFrame:
    """Median and worst |predicted / measured - 1| per iteration kind and per op, and the median
    of predicted / measured."""
    groups = []
    for (device, model), its in iterations.groupby(["device", "model"], sort=True):
        groups += [("iteration", kind, g) for kind, g in its.groupby("kind")]
        groups.append(("iteration", f"prefill >= {LARGE_PREFILL} tokens",
                       its[(its.kind == "prefill") & (its.tokens >= LARGE_PREFILL)]))
        op_rows = ops[(ops.device == device) & (ops.model == model)]
        groups += [("op", op, g) for op, g in op_rows.groupby("op", sort=False)]
    keys = ["device", "model", "level", "kind"]
    found = [point_table.from_wide(g.assign(level=level, kind=kind), SOURCE, models_in(g), keys)
             for level, kind, g in groups if len(g)]
    if not found:
        return pd.DataFrame()
    return point_table.per_model(pd.concat(found, ignore_index=True), keys,
                                 (fidelity.ERRORS, {"median_ratio": "median_ratio"}),
                                 count="points", sort=False)
