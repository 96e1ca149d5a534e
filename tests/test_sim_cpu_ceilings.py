"""The CPU's ceilings: measured by measure/profiling/cpu_ceilings.py into a file, read by the simulator."""
from __future__ import annotations

import json
import logging

import pytest

from sarathi_lab.config import ConfigError
from sarathi_lab.sim.device import CEILINGS_ENV, MEASURE_COMMAND, cpu_ceilings_key, load_device

DAMAGED = ["", "{", "[1, 2]", '{"KEY": {"copy_gbps": "x", "matmul_gflops": 1}}', '{"KEY": 3}']


def test_the_simulated_cpu_is_the_file_s_entry_with_its_provenance(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    entry = {"copy_gbps": 4.0, "matmul_gflops": 30.0, "threads": 2,
             "measured_at": "2026-01-01T00:00:00Z"}
    path.write_text(json.dumps({cpu_ceilings_key("float32"): entry}))
    monkeypatch.setenv(CEILINGS_ENV, str(path))
    dev = load_device("cpu", "float32")
    assert (dev.peak_flops, dev.memory_bandwidth) == (30e9, 4e9)
    assert dev.sources == ((f"measured on {cpu_ceilings_key('float32')} with 2 threads at "
                            f"2026-01-01T00:00:00Z, read from {path}"),)


OTHER_CPU = '{"other|float32": {"copy_gbps": 1, "matmul_gflops": 1}}'


@pytest.mark.parametrize("content", [None, OTHER_CPU, *DAMAGED])
def test_a_missing_or_damaged_file_fails_in_one_line_naming_the_command(content, tmp_path,
                                                                         monkeypatch):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv(CEILINGS_ENV, str(path))
    with pytest.raises(ConfigError) as e:
        load_device("cpu", "float32")
    assert str(e.value).startswith(f"sim_device='cpu' needs this CPU's measured ceilings: {path} ")
    assert str(e.value).endswith(f"; measure them with {MEASURE_COMMAND} --dtype float32")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("content", DAMAGED)
def test_measuring_replaces_a_damaged_file_with_one_warning(content, tmp_path, monkeypatch, caplog):
    from sarathi_lab.measure.profiling import ceilings, cpu_ceilings

    path = tmp_path / "c.json"
    path.write_text(content)
    monkeypatch.setenv(CEILINGS_ENV, str(path))
    monkeypatch.setattr(ceilings, "FULL", {"copy_mib": 1, "matmul_n": 64, "reps": 1})
    with caplog.at_level(logging.WARNING):
        cpu_ceilings.ensure("float32")
    assert f"the CPU ceilings {path} are " in caplog.text
    assert load_device("cpu", "float32").peak_flops > 0
    caplog.clear()
    cpu_ceilings.ensure("float32")   # present now: nothing measured, nothing said
    assert caplog.text == ""


def test_ceilings_measured_for_a_run_say_so_in_one_line_with_the_load_they_were_measured_under(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sarathi_lab import host_load
    from sarathi_lab.measure.profiling import ceilings, cpu_ceilings

    path = tmp_path / "c.json"
    monkeypatch.setenv(CEILINGS_ENV, str(path))
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda *a, **k: SimpleNamespace(
        copy_gbps=4.0, matmul_gflops=30.0, threads=2, copy_mib=1, matmul_n=64))
    busy = {"runqueue_wait_share": 0.5, "timing_unreliable": True, "timing_note": "busy"}
    monkeypatch.setattr(host_load, "assess", lambda start, end: busy)
    entry = cpu_ceilings.ensure("float32")
    assert json.loads(path.read_text())[cpu_ceilings_key("float32")]["runqueue_wait_share"] == 0.5
    line = cpu_ceilings.measured_line(entry, "token_budget=auto of capacity")
    assert line.startswith("measured this CPU's ceilings in float32 for token_budget=auto of capacity "
                           f"(none were in {path}): copy 4 GB/s, matmul 30 GFLOP/s with 2 threads; ")
    assert line.endswith("other work distorted them (its threads waited for a CPU 50% of the time they "
                         "were ready), so the budgets they size are too small: "
                         f"{MEASURE_COMMAND} --dtype float32 on a quiet machine measures them again")
    assert cpu_ceilings.ensure("float32") is None   # present now: nothing measured
    quiet = entry | {"timing_unreliable": False}
    assert cpu_ceilings.measured_line(quiet, "x").endswith("with 2 threads")
