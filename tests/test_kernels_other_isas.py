"""The CPU kernels' tests and the engine-vs-transformers grid again, on the code other machine kinds
get: the kernels built for an older -march target (SARATHI_KERNELS_MARCH,
kernels/sarathi_kernels/cpu_build.py) and oneDNN, MKL and torch's dispatch capped at that kind's ISA
(measure/profiling/isa.py), on this CPU when it has that target's instructions. x86-64-v3 is an AVX2-only
machine (the AMD EPYC kind without AVX-512); cascadelake is an Intel Xeon with AVX-512 and VNNI but
no bfloat16 instructions, where the bfloat16 linear takes its float32 path instead of vdpbf16ps;
cooperlake has them but no AMX (the AMD EPYC Zen 4 kind), so on a Sapphire Rapids Xeon it runs the
vdpbf16ps path that AMX replaces. Each runs in a fresh interpreter with its own build, as a user on
that machine would. The kinds and the CPU flags each needs are
sarathi_lab/measure/profiling/isa.py's, the ones `bench.as_isa` measures as."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.measure.profiling import isa
from sarathi_lab.measure.profiling.machine import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
# The engine's grid: float32 greedy tokens equal transformers' whichever ISA's code runs, the
# transformers reference held to the same kind in the same process.
KIND_TESTS = ["tests/test_cpu_small_linear.py", "tests/test_cpu_ops.py", "tests/test_cpu_attention.py",
              "tests/test_sampler.py", "tests/test_engine_vs_hf.py"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(isa.KINDS))
def test_kernel_and_engine_tests_pass_as_another_machine_kind(kind, tmp_path):
    target = isa.KINDS[kind].march
    if not isa.KINDS[kind].needs <= cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(isa.KINDS[kind].environment(kind), XDG_CACHE_HOME=str(tmp_path))
    # Hypothesis' "ci" profile derandomises: every kind runs the same examples, and one that failed
    # on some machine fails there again rather than at random. How the kernels are built, cached and
    # loaded is the same for every kind: those tests run once, in the session that starts this one.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-n", "0", "-m", "not kernel_build",
                           "-p", "no:cacheprovider",
                           "--hypothesis-profile=ci", *KIND_TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # A skip is the kind's own limit (oneDNN without bf16 on AVX2), never kernels that did not build.
    assert " passed" in done.stdout and "did not build" not in done.stdout, done.stdout[-1000:]
    assert list(tmp_path.rglob("cpu_kernels-*.so")), "the kernels were not built for the target"
