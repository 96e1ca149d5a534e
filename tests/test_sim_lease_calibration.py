"""The calibration refitted to a GPU lease's kernel tables (sim_check/calibration_cli.py, calibration.fit_lease):
the committed H100 lease's tables read as kernel rows, the refit keeps time monotone where its curve
meets the base's, and the device file's H100 calibration predicts that lease's own iterations (the
launch step's CUDA-graph forwards, which the fit never saw) within the simulator's 10% target."""
from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.measure.sim_check.calibration_cli import LEASES_DIR, calibrations, lease_kernels, newest_lease
from sarathi_lab.sim import CostModel
from sarathi_lab.sim.calibration import ATTENTION_FIELDS, Calibration, fit_lease, measured_shape
from sarathi_lab.sim.device import load_device

LEASE = LEASES_DIR / "h100" / "2026-11-27_7fae342"
LAUNCH = re.compile(r"engine_ms\[(?:c=(\d+)\+)?b=(\d+)(?:,ctx=(\d+))?\]")


def test_the_lease_tables_read_as_kernel_rows_of_each_model():
    table = lease_kernels(LEASE)
    assert set(table.model) == {"llama-13b", "mistral-7b"}
    ops = table.groupby("model").op.unique().map(set)
    assert all(o == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "prefill_attention", "decode_attention"}
               for o in ops)
    gemm = table[table.op == "down_proj"]
    assert sorted(gemm.tokens.unique()) == [128, 256, 512, 1024] and (gemm.seconds > 0).all()
    # A chunk's context is the request's once cached: never below its tokens.
    pre = table[table.op == "prefill_attention"]
    assert (pre.context >= pre.tokens).all()
    assert newest_lease("h100") is not None and newest_lease("nowhere") is None


def _base(tokens, eff) -> Calibration:
    return Calibration(gemm_tokens=tuple(tokens), gemm_efficiency=tuple(eff), gemm_launch_s=(5e-6,) * len(tokens),
                       pointwise={"norm": (2e-6, 0.5)}, fitted_from=("base",))


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(0.5, 1.6), slope=st.floats(0.0, 1.0))
def test_time_per_weight_never_falls_with_more_tokens_across_the_seam(scale, slope):
    tokens = [1, 64, 120, 128, 200, 1100, 2048]
    base = _base(tokens, [min(1.0, 0.01 + slope * t / 2048) for t in tokens])
    rows = pd.DataFrame([{"model": "llama-13b", "op": op, "tokens": t, "context": 0, "batch": 0,
                          "seconds": 4e-6 + scale * k * n * 2 * t / (989e12 * 0.6)}
                         for op, (k, n) in measured_shape("llama-13b").gemms.items() for t in (128, 256, 512, 1024)])
    cal = fit_lease(base, rows, 989e12, 3.35e12, "lease x")
    per_weight = np.array(cal.gemm_tokens) / np.array(cal.gemm_efficiency)
    assert (np.diff(per_weight) >= -1e-9 * per_weight[1:]).all() and (np.diff(cal.gemm_launch_s) >= 0).all()
    assert cal.pointwise == base.pointwise and cal.fitted_from == ("base", "lease x")
    assert 200 not in cal.gemm_tokens and {128, 256, 512, 1024, 1100, 2048} <= set(cal.gemm_tokens)


def test_the_device_file_holds_the_lease_refit():
    cal = load_device("h100").calibration
    assert cal.fitted_from[-1] == f"lease {LEASE.name}" and cal.has_attention
    fitted = calibrations()["h100"]
    assert {f: getattr(cal, f) for f in ATTENTION_FIELDS} == pytest.approx(
        {f: getattr(fitted, f) for f in ATTENTION_FIELDS}, rel=1e-3)


def test_the_lease_calibration_predicts_the_leases_graph_forwards():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = CostModel.for_device("h100", "llama-13b", "calibrated")
    metrics = json.loads((LEASE / "steps" / "launch" / "result.json").read_text())["metrics"]
    errors = []
    for m in metrics:
        if not (g := LAUNCH.fullmatch(m["metric"])):
            continue
        chunk, decodes, context = int(g[1] or 0), int(g[2]), int(g[3] or 1024)
        cost = cm.iteration_cost([(chunk, context)] if chunk else [], [context + 1] * decodes,
                                 num_sampled=(chunk > 0) + decodes)
        errors.append(cost.forward_s * 1e3 / m["value"] - 1)
    assert len(errors) == 26
    assert np.median(np.abs(errors)) <= 0.10
