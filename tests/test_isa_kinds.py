"""Measuring as another x86 machine kind (sarathi_lab/measure/profiling/isa.py, measure/bench/as_isa.py): each kind's
restriction reaches every library in a fresh interpreter, as a user starts it, and the record says so."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sarathi_lab.measure.profiling import isa
from sarathi_lab.measure.profiling.machine import cpu_flags

# What a process held to each kind sees: torch's AVX-512 probe, the engine's bf16 choice, the
# kernels' vector width (floats), torch's dispatch capability.
EXPECTED = {"avx2": "False False 8 AVX2", "avx512-vnni": "True False 16 AVX512", "avx512-bf16": "True True 16 AVX512"}
PROBE = ("from sarathi_lab.measure.profiling import isa; isa.apply(); import torch; "
         "from sarathi_kernels import cpu_ops;"
         "from sarathi_lab.host_features import cpu_has_bf16_units;"
         "print(torch.cpu._is_avx512_supported(), cpu_has_bf16_units(), cpu_ops._tile_columns(),"
         " torch.backends.cpu.get_cpu_capability())")


def _clean_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != isa.ENV}
    return env | extra


def _runnable(name: str) -> None:
    if not isa.KINDS[name].needs <= cpu_flags():
        pytest.skip(f"this CPU cannot run the {name} kind's code")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_library_is_held_to_the_kind(name, tmp_path):
    _runnable(name)
    env = _clean_env(XDG_CACHE_HOME=str(tmp_path), **isa.KINDS[name].environment(name))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == EXPECTED[name].split()


def test_as_isa_runs_a_benchmark_and_labels_its_record(tmp_path):
    _runnable("avx2")
    out = tmp_path / "ceilings.json"
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "ceilings", "--isa", "avx2", "--smoke",
                           "--threads", "1", "--out", str(out)], env=_clean_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held to the avx2 kind" in done.stdout
    machine = json.loads(out.read_text())["machine"]
    assert machine["isa_as"] == "avx2" and "avx512" not in machine["isa"] and not machine["bf16_units"]


@pytest.mark.parametrize("argv, says", [(["ceilings", "--isa", "avx3"], "--isa: invalid choice: 'avx3'"),
                                        (["nope", "--isa", "avx2"], "measurement 'nope' is invalid")])
def test_as_isa_refuses_in_one_line(argv, says):
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", *argv], env=_clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr


def test_an_unknown_kind_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv(isa.ENV, "sse9")
    with pytest.raises(ValueError, match="SARATHI_ISA_AS='sse9': not a kind of"):
        isa.active()
