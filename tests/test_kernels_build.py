"""The CPU kernels compile to whole-register vector code for every x86 machine kind, not only this one.

A GCC vector wider than the target's registers is lowered piecewise, through the stack: the
AVX2-only build of the kernels once ran 7-58x slower than the AVX-512 one on the same CPU, with
every test passing (benchmarks/RESULTS.md). GCC says so with -Wvector-operation-performance, so
each source is compiled here for each target, with the library's own flags, and any such warning
fails. Compiling needs no CPU of that kind, so every target is checked on any machine."""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from sarathi_kernels import cpu_build

# AVX-512 with bf16 and AMX (Sapphire Rapids Xeon), with bf16 only (as Zen 4; GCC 12 has no znver4),
# with VNNI and no bf16 (Cascade Lake Xeon), AVX2 + FMA (EPYC before Zen 4), and the x86-64 baseline.
TARGETS = ["sapphirerapids", "cooperlake", "cascadelake", "x86-64-v3", "x86-64"]
COMPILER = "c++"


@pytest.mark.skipif(shutil.which(COMPILER) is None, reason="no C++ compiler")
@pytest.mark.parametrize("target", TARGETS)
def test_no_vector_operation_is_lowered_piecewise(target, tmp_path):
    def compile_one(src):
        cmd = [COMPILER, *cpu_build.compile_flags(target), "-Wvector-operation-performance", str(src),
               "-o", str(tmp_path / f"{src.stem}.o")]
        return src.name, subprocess.run(cmd, capture_output=True, text=True, check=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, cpu_build.SOURCES))
    for name, done in results:
        assert done.returncode == 0, f"{name} for {target}: {done.stderr[-2000:]}"
        assert "vector-operation-performance" not in done.stderr, f"{name} for {target}:\n{done.stderr[-3000:]}"
