"""The CPU kernels' tests again, on the code other machine kinds get: the kernels built for an older
-march target (SARATHI_KERNELS_MARCH, kernels/sarathi_kernels/cpu_build.py) run on this CPU when it
has that target's instructions. x86-64-v3 is an AVX2-only machine (the AMD EPYC kind without
AVX-512); cascadelake is an Intel Xeon with AVX-512 and VNNI but no bfloat16 instructions, where
the bfloat16 linear takes its float32 path instead of vdpbf16ps; cooperlake has them but no AMX
(the AMD EPYC Zen 4 kind), so on a Sapphire Rapids Xeon it runs the vdpbf16ps path that AMX replaces. Each runs in a fresh interpreter
with its own build, as a user on that machine would. The kinds and the CPU flags each needs are
sarathi_lab/profiling/isa.py's, the ones `bench.as_isa` measures as."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.profiling import isa
from sarathi_lab.profiling.machine import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TESTS = ["tests/test_cpu_small_linear.py", "tests/test_cpu_ops.py", "tests/test_cpu_attention.py",
                "tests/test_sampler.py"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(isa.KINDS))
def test_kernel_tests_pass_when_built_for_another_machine_kind(kind, tmp_path):
    target = isa.KINDS[kind].march
    if not isa.KINDS[kind].needs <= cpu_flags():
        pytest.skip(f"this CPU cannot run {target} code")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(SARATHI_KERNELS_MARCH=target, XDG_CACHE_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *KERNEL_TESTS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1], done.stdout[-1000:]
    assert list(tmp_path.rglob("cpu_kernels-*.so")), "the kernels were not built for the target"
