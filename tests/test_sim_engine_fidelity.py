"""sim_fidelity's engine-profile join: a table task=profile wrote, held against the GPU cost models."""
import math

import pandas as pd
import pytest

from sarathi_lab.measure.sim_check import engine_fidelity
from sarathi_lab.model import load_config
from sarathi_lab.sim.device import load_device
from sarathi_lab.sim.roofline import CalibratedRooflineCostModel, RooflineCostModel

# op, tokens, context, batch, seconds: task=profile's rows (measure/profiling/ops.py's split and bare forwards).
ROWS = [("qkv_proj", 4, 4, 1, 0.0011), ("o_proj", 4, 4, 1, 0.0012), ("ffn", 4, 4, 1, 0.0013),
        ("others", 4, 4, 1, 0.0014), ("qkv_proj", 64, 64, 1, 0.0021), ("o_proj", 64, 64, 1, 0.0022),
        ("ffn", 64, 64, 1, 0.0023), ("others", 64, 64, 1, 0.0024), ("prefill_attention", 16, 48, 1, 0.0031),
        ("decode_attention", 2, 100, 2, 0.0041), ("total", 64, 64, 1, 0.0201), ("total", 2, 100, 2, 0.0202),
        ("lm_head", 2, 0, 2, 0.0001), ("sample", 2, 0, 2, 0.0001), ("prepare", 64, 64, 1, 0.0001)]


def _write(root, device, model, rows=ROWS):
    (root / device).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["op", "tokens", "context", "batch", "seconds"]).to_csv(
        root / device / f"{model}.csv", index=False)


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path))
    _write(tmp_path, "h200", "tiny")
    _write(tmp_path, "cpu", "tiny")            # not a simulated GPU: skipped
    _write(tmp_path, "h200", "no-such-model")  # no preset to shape the cost models: skipped
    return tmp_path


def test_measured_seconds_come_out_as_they_went_in(profiles):
    ops, its = engine_fidelity.run(["a100", "h200"])  # the A100 has no engine profile: no rows
    assert set(ops.device) == set(its.device) == {"h200"} and set(ops.model) == {"tiny"}
    measured = ops.set_index(["op", "tokens", "context", "batch"]).measured_s
    for op, tokens, context, batch, seconds in ROWS:
        if op in ("qkv_proj", "o_proj", "ffn", "others", "prefill_attention", "decode_attention"):
            assert measured[(op, tokens, context, batch)] == seconds
    assert sorted(zip(its.kind, its.measured_s)) == [("decode", 0.0202), ("prefill", 0.0201)]
    # Each prediction is the cost model's own forward for that iteration, built here independently.
    roofline = RooflineCostModel(load_device("h200"), load_config("tiny"))
    prefill, decode = its.set_index("kind").loc["prefill"], its.set_index("kind").loc["decode"]
    assert prefill.roofline_s == roofline.iteration_cost([(64, 64)], []).forward_s
    assert decode.roofline_s == roofline.iteration_cost([], [100, 100]).forward_s
    # The H200 has no calibration of its own: the roofline and the H100's, labelled; and the profile cost
    # model on the same table (per iteration only).
    assert {c for c in its if c.endswith("_s")} == {"measured_s", "roofline_s", "h100_calibration_s", "profile_s"}
    assert {c for c in ops if c.endswith("_s")} == {"measured_s", "roofline_s", "h100_calibration_s"}


def test_the_join_skips_a_device_with_no_profile(profiles):
    ops, its = engine_fidelity.run(["a100"])
    assert ops.empty and its.empty
    assert engine_fidelity.profiled() == [("h200", "tiny")]


def test_a_prediction_equal_to_the_measurement_has_no_error(profiles):
    cm = RooflineCostModel(load_device("h200"), load_config("tiny"))
    exact = cm.iteration_cost([(64, 64)], []).forward_s
    _write(profiles, "h200", "tiny", [r if r[:4] != ("total", 64, 64, 1) else (*r[:4], exact) for r in ROWS])
    errors = engine_fidelity.errors(*engine_fidelity.run())
    row = errors[(errors.level == "iteration") & (errors.kind == "prefill")].iloc[0]
    assert row.roofline_median_err == 0 and row.roofline_median_ratio == 1
    assert errors[errors.level == "op"].kind.tolist() == ["qkv_proj", "o_proj", "ffn", "others",
                                                           "prefill_attention", "decode_attention"]


@pytest.mark.parametrize("device", ["a100", "h200"])
def test_the_engine_grouping_neither_drops_nor_doubles_a_part(device):
    """qkv + o + ffn + others + attention, as the engine times them, is the cost model's whole forward."""
    for cm in engine_fidelity.cost_models(device, load_config("llama2-7b"), "bfloat16").values():
        for prefills, decodes in (([(512, 1536)], []), ([], [700] * 8), ([(100, 300)], [50] * 3)):
            cost = cm.iteration_cost(prefills, decodes)
            tokens = sum(c for c, _ in prefills) + len(decodes)
            parts = engine_fidelity.as_engine_times(cm, cost.ops, tokens)
            assert math.isclose(sum(parts.values()), cost.forward_s, rel_tol=1e-12)
            assert min(parts.values()) > 0


def test_pointwise_parts_add_up_to_the_pointwise_kernel():
    config, a100 = load_config("llama2-7b"), load_device("a100")
    for cm in (RooflineCostModel(a100, config), CalibratedRooflineCostModel(a100, config)):
        for tokens in (1, 100, 4096):
            assert math.isclose(sum(cm.pointwise_parts_s(tokens).values()), cm.pointwise_s(tokens), rel_tol=1e-12)
    assert set(engine_fidelity.cost_models("a100", config, "bfloat16")) == {"roofline", "calibrated"}
