"""A config is a plain typed value: built and checked without probing this host; the plan probes the
host once and records what it found."""
from __future__ import annotations

import os

import pytest
import torch

from sarathi_lab import host_features
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.plan import HostFacts, plan_engine, probe_host


def _no_probe(*args, **kwargs):
    raise AssertionError("the host was probed")


@pytest.fixture
def unprobed(monkeypatch):
    """Every probe of the host raises: CUDA, the cores, the CPU's features."""
    for cached in (host_features.cuda_available, host_features.cpu_has_onednn_fp16,
                   host_features.cpu_has_bf16_units):
        cached.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", _no_probe)
    monkeypatch.setattr(torch.cuda, "device_count", _no_probe)
    monkeypatch.setattr(os, "sched_getaffinity", _no_probe)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", _no_probe)
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", _no_probe, raising=False)
    yield
    for cached in (host_features.cuda_available, host_features.cpu_has_onednn_fp16,
                   host_features.cpu_has_bf16_units):
        cached.cache_clear()


@pytest.mark.parametrize("settings", [
    {}, {"device": "cuda"}, {"device": "cpu", "dtype": "float16"}, {"num_threads": 10**6},
    {"tensor_parallel": 64, "device": "cuda"}, {"attention_hybrid": "pod"},
    {"executor": "sim", "sim_device": "cpu", "dtype": "float16"},
])
def test_a_config_builds_and_reads_without_probing_the_host(unprobed, settings):
    cfg = EngineConfig(**settings)
    # Every attribute read, properties too: what the device or dtype resolve to is the plan's.
    read = {name: getattr(cfg, name) for name in dir(cfg) if not name.startswith("_")}
    assert read["device"] == settings.get("device", "auto")


def test_a_run_config_parses_without_probing_the_host(unprobed):
    overrides = ["experiment=smoke", "device=cuda", "device.num_threads=100000"]
    run = parse_config(compose_config(overrides))
    assert run.engine.device == "cuda" and run.engine.num_threads == 100000


def test_the_plan_records_what_it_probed():
    small = {"max_model_len": 64, "num_kv_blocks": 16}
    plan = plan_engine(EngineConfig(device="cpu", dtype="float32", **small))
    assert plan.host == HostFacts(cores=len(os.sched_getaffinity(0)), device_type="cpu")
    assert plan.device == torch.device("cpu")
    sim = plan_engine(EngineConfig(executor="sim", **small))
    assert sim.host.device_type is None and sim.host.cuda_devices is None and sim.device is None


def test_auto_resolves_to_cuda_only_where_this_host_has_it(monkeypatch):
    small = {"max_model_len": 64, "num_kv_blocks": 16, "dtype": "float32"}
    monkeypatch.setattr("sarathi_lab.host_features.cuda_available", lambda: False)
    assert plan_engine(EngineConfig(**small)).host.device_type == "cpu"
    monkeypatch.setattr("sarathi_lab.host_features.cuda_available", lambda: True)
    assert probe_host(EngineConfig(**small)).device_type == "cuda"
    assert probe_host(EngineConfig(device="cpu", **small)).device_type == "cpu"


def test_the_plan_refuses_what_this_host_cannot_run(monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 2)
    with pytest.raises(ConfigError, match=r"^num_threads=3 is invalid: this process may run on 2 "):
        probe_host(EngineConfig(num_threads=3))
    monkeypatch.setattr("sarathi_lab.plan.cuda_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device='cuda' is invalid: no CUDA device"):
        probe_host(EngineConfig(device="cuda"))
    monkeypatch.setattr("sarathi_lab.plan.cpu_has_onednn_fp16", lambda: False)
    with pytest.raises(ConfigError, match=r"^dtype='float16' is invalid: this CPU's oneDNN has no"):
        probe_host(EngineConfig(device="cpu", dtype="float16"))
    aten = EngineConfig(device="cpu", dtype="float16", cpu_linear="aten")
    assert probe_host(aten).cpu_fp16 is None
