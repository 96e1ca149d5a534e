"""The suite does not assume the CPU it runs on: every decision the engine takes from this CPU's
features (config refusals, the dtype that runs, the simulated CPU's dtype, the linear layers' GEMM)
is taken here as each CPU kind the project meets would take it, by answering the feature probes as
that kind does. Each either runs in the dtype that kind runs or is refused with the documented
one-line error; none crashes, none runs a dtype the kind has no units for. The kinds are
measure/profiling/isa.py's (the ones bench.as_isa measures as and tests/test_kernels_other_isas.py builds
for) and the AMX Xeon they are emulated on; the kernels' own ISA paths are that test's."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sarathi_lab.config import DTYPES, ConfigError, EngineConfig
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.host_features import run_dtype
from sarathi_lab.measure.profiling import isa
from sarathi_lab.model import cpu_linear
from sarathi_lab.plan import plan_engine

# Whether each kind has bf16 matrix units (as isa.apply makes torch's probes answer) and oneDNN's
# float16 (avx512_fp16 or avx_ne_convert, which none of the emulated kinds has: Zen 4, Cascade Lake
# and Zen 3 lack both, and their oneDNN ISA caps exclude it).
KINDS = {"amx": (True, True)} | {name: (kind.has("avx512_bf16"), False) for name, kind in isa.KINDS.items()}
FLOAT16_REFUSAL = ("dtype='float16' is invalid: this CPU's oneDNN has no float16 matmul (it needs avx_ne_convert or "
                   "avx512_fp16); allowed here: bfloat16, float32, or float16 with {key}=aten")


@pytest.fixture(params=sorted(KINDS))
def kind(request, monkeypatch):
    """This process answering the feature probes as the kind does, on a machine without a GPU."""
    bf16_units, fp16 = KINDS[request.param]
    monkeypatch.setattr("sarathi_lab.host_features.cpu_has_bf16_units", lambda: bf16_units)
    monkeypatch.setattr("sarathi_lab.plan.cpu_has_onednn_fp16", lambda: fp16)
    monkeypatch.setattr("sarathi_lab.model.cpu_linear.cpu_has_onednn_fp16", lambda: fp16)
    monkeypatch.setattr("sarathi_lab.host_features.cuda_available", lambda: False)
    # The simulated CPU's ceilings are measured on this machine: borrowed here, as no unit test measures.
    from sarathi_lab.sim import load_device

    ceilings = dataclasses.replace(load_device("a100"), name="cpu")
    monkeypatch.setattr("sarathi_lab.sim.device.cpu_device", lambda dtype="bfloat16": ceilings)
    return request.param


def _runs(dtype: str, bf16_units: bool) -> torch.dtype:
    """What a CPU runs when asked for ``dtype``, written out: bfloat16 only with bf16 units."""
    return torch.float32 if dtype == "bfloat16" and not bf16_units else getattr(torch, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("linear", ["auto", "aten"])
@pytest.mark.parametrize("where", [{"device": "cpu"}, {"device": "auto"},
                                   {"executor": "sim", "sim_device": "cpu"}, {"executor": "sim", "sim_device": "a100"}],
                         ids=["cpu", "auto", "sim-cpu", "sim-a100"])
def test_each_kind_runs_its_dtype_or_refuses_in_one_line(kind, dtype, linear, where):
    bf16_units, fp16 = KINDS[kind]
    on_this_cpu = where.get("sim_device", "cpu") == "cpu"
    cfg = dict(model="tiny", dtype=dtype, cpu_linear=linear, **where)
    if dtype == "float16" and on_this_cpu and linear != "aten" and not fp16:
        with pytest.raises(ConfigError) as refused:
            plan_engine(EngineConfig(**cfg))  # the plan probes this CPU; the config alone does not
        assert str(refused.value) == FLOAT16_REFUSAL.format(key="cpu_linear")
        return
    plan = plan_engine(EngineConfig(**cfg))
    # A simulated GPU runs what was asked whatever this CPU has; this CPU, real or simulated, its own.
    assert plan.dtype == (_runs(dtype, bf16_units) if on_this_cpu else getattr(torch, dtype))
    assert plan.num_kv_blocks > 0
    if not on_this_cpu:
        assert plan.cost_model.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_kind_refuses_through_the_run_config_naming_the_full_key(kind, dtype):
    _, fp16 = KINDS[kind]
    overrides = ["experiment=smoke", "logger=none", "device=cpu", f"dtype={dtype}"]
    if dtype == "float16" and not fp16:
        with pytest.raises(ConfigError) as refused:
            preflight(parse_config(compose_config(overrides)))
        assert str(refused.value) == FLOAT16_REFUSAL.format(key="engine.cpu_linear")
        overrides.append("engine.cpu_linear=aten")  # the way out it names
    # A simulated GPU is never this CPU's to refuse.
    preflight(parse_config(compose_config([*overrides, "executor=sim"])))
    checked = preflight(parse_config(compose_config(overrides)))
    assert checked.plan.dtype == _runs(dtype, KINDS[kind][0])


def test_each_kind_picks_its_fast_dtype_and_its_linear_gemm(kind):
    bf16_units, fp16 = KINDS[kind]
    assert run_dtype("bfloat16", "cpu") == ("bfloat16" if bf16_units else "float32")
    assert run_dtype("bfloat16", "cuda") == "bfloat16"
    # float16's packed linear only where the kind's oneDNN has float16 (MKL's is float32 only): where
    # it has none, nothing packs float16 weights (the config refused any cpu_linear but aten above).
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        assert cpu_linear.onednn_available(torch.float16) == fp16
        for asked in ("auto", "mkl", "onednn"):
            assert cpu_linear.packed_gemm(asked, torch.float16) == ("onednn" if fp16 else None)
