"""The calibrated roofline: its fit recovers known curves, keeps time monotone in tokens, holds a
model out honestly, and reads and refuses device files as the project's configs do."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab.config import ConfigError
from sarathi_lab.measure.sim_check import fidelity
from sarathi_lab.model import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import CostModel
from sarathi_lab.sim.calibration import (
    Calibration,
    fit,
    fit_gemm,
    fit_pointwise,
    measured_shape,
    pointwise_elems,
)
from sarathi_lab.sim.device import load_device
from sarathi_lab.sim.roofline import CalibratedRooflineCostModel

PEAK = 312e12
TOKENS = [1, 8, 64, 120, 128, 136, 256, 264, 512]
FIXTURE_MODELS = ("llama2-7b", "internlm-20b", "llama2-70b")


def _per_weight(t: int) -> float:
    """A known cost per weight element: a 128-token tile (a batch of 129 costs as 256)."""
    return 2 * (-(-t // 128) * 128) / (PEAK * 0.7)


def _gemm_fixture(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for model in FIXTURE_MODELS:
        for op, (k, n) in measured_shape(model).gemms.items():
            for t in TOKENS:
                seconds = 4e-6 + k * n * _per_weight(t)
                rows.append({"model": model, "op": op, "tokens": t, "context": 0, "batch": 0,
                             "seconds": seconds * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def _cal(tokens, eff, launch) -> Calibration:
    return Calibration(gemm_tokens=tuple(tokens), gemm_efficiency=tuple(eff), gemm_launch_s=tuple(launch),
                       pointwise={})


def test_the_gemm_fit_recovers_a_known_curve_and_its_tile_step():
    tokens, eff, launch = fit_gemm(_gemm_fixture(), PEAK)
    cal = _cal(tokens, eff, launch)
    for t in TOKENS:
        assert cal.gemm_s(t, 4096, 4096, PEAK) == pytest.approx(4e-6 + 4096 * 4096 * _per_weight(t), rel=1e-6)
    # One token past the tile costs a whole tile more: the step is in the curve, not smoothed away.
    assert cal.gemm_s(136, 4096, 4096, PEAK) > 1.8 * cal.gemm_s(128, 4096, 4096, PEAK) - 8e-6


def test_the_hold_out_fits_without_the_model_it_predicts():
    table = _gemm_fixture()
    held = "internlm-20b"
    tokens, eff, launch = fit_gemm(table[table.model != held], PEAK)
    cal = _cal(tokens, eff, launch)
    k, n = measured_shape(held).gemms["gate_up_proj"]
    # The fixture's cost is the same function of K * N for every model: a held-out model is predicted.
    assert cal.gemm_s(256, k, n, PEAK) == pytest.approx(4e-6 + k * n * _per_weight(256), rel=1e-6)
    # And on real data the fit without a model lists every model but that one.
    assert "phi-2" not in fit(load_device("a100"), exclude=("phi-2",)).fitted_from


@settings(max_examples=30, deadline=None)
@given(noise=st.floats(0.0, 0.1), seed=st.integers(0, 1000))
def test_fitted_gemm_time_never_falls_with_more_tokens(noise, seed):
    tokens, eff, launch = fit_gemm(_gemm_fixture(noise, seed), PEAK)
    cal = _cal(tokens, eff, launch)
    times = [cal.gemm_s(t, 5120, 13824, PEAK) for t in range(1, 600, 7)]
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times))


def test_pointwise_fit_recovers_launch_and_bandwidth_share():
    rows = []
    for model in FIXTURE_MODELS:
        elems = pointwise_elems("norm", measured_shape(model))
        rows += [{"model": model, "op": "input_norm", "tokens": t, "seconds": 3e-6 + t * elems * 2 / (2e12 * 0.5)}
                 for t in TOKENS]
    launch, eff = fit_pointwise(pd.DataFrame(rows), 2e12, 2)["norm"]
    assert launch == pytest.approx(3e-6, rel=1e-6) and eff == pytest.approx(0.5, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 4000), extra=st.integers(1, 300), decodes=st.integers(0, 64))
def test_calibrated_iterations_grow_with_tokens_and_context(tokens, extra, decodes):
    cm = CostModel.for_device("a100", "llama2-7b", "calibrated")
    assert isinstance(cm, CalibratedRooflineCostModel)
    base = cm.iteration_time_s(prefills=[(tokens, tokens)], decodes=[1000] * decodes)
    assert cm.iteration_time_s(prefills=[(tokens + extra, tokens + extra)], decodes=[1000] * decodes) >= base
    assert cm.iteration_time_s(prefills=[(tokens, tokens + extra)], decodes=[1000] * decodes) >= base


def test_decode_attention_has_a_latency_floor():
    cm = CostModel.for_device("a100", "llama2-7b", "calibrated")
    roof = CostModel.for_device("a100", "llama2-7b", "roofline")
    assert cm.decode_attention_s([2]) > 2 * roof.decode_attention_s([2])
    assert cm.decode_attention_s([2]) >= load_device("a100").calibration.decode_launch_s


def test_calibration_reads_back_and_refuses_with_one_line():
    cal = load_device("a100").calibration
    assert Calibration.from_dict(dataclasses.asdict(cal)) == cal
    with pytest.raises(ConfigError, match=r"^sim.device.calibration.gemm_speed is not a known key"):
        Calibration.from_dict(dataclasses.asdict(cal) | {"gemm_speed": 1})
    with pytest.raises(ConfigError, match=r"^sim.device.calibration.gemm_tokens has 2 points"):
        dataclasses.replace(cal, gemm_tokens=(1, 2))
    with pytest.raises(ConfigError, match=r"^sim_cost_model='calibrated' is invalid with sim_device='h200'"):
        CostModel.for_device("h200", "llama2-7b", "calibrated")


def test_fidelity_compares_like_with_like_on_a_measured_model():
    cal = load_device("a100").calibration
    ops, its = fidelity.compare("a100", "llama2-7b", cal, cal, op_tokens=(128,),
                                iterations={"decode b=4": ([], 4), "prefill 512@512": ([(512, 512)], 0)})
    assert set(ops.op) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "pointwise", "embedding"}
    assert (its.attention).all() and (its.measured_s > 0).all()
    # The iteration is the layer's kernels times the layers, the embedding, and attention.
    assert (its.calibrated_s / its.measured_s).between(0.8, 1.2).all()
    assert Shape.of(PRESETS["llama2-7b"]).gemms == measured_shape("llama2-7b").gemms


def test_one_token_past_a_tile_costs_the_step_on_both_gpu_cost_models():
    import warnings

    for name in ("calibrated", "profile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = CostModel.for_device("a100", "llama2-7b", name)
        at = {t: cm.iteration_cost(prefills=[(t, t)], num_sampled=0).ops["gate_up_proj"] for t in (256, 257, 264)}
        # The measured grid has 256 and 264: 257 is past the tile, so it costs as 264.
        assert at[257] == pytest.approx(at[264]) and at[257] > at[256], name
