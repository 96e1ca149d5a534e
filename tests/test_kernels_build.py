"""The CPU kernels compile to whole-register vector code for every x86 machine kind, not only this one.

A GCC vector wider than the target's registers is lowered piecewise, through the stack: the
AVX2-only build of the kernels once ran 7-58x slower than the AVX-512 one on the same CPU, with
every test passing (benchmarks/RESULTS.md). GCC says so with -Wvector-operation-performance, so
each source is compiled here for each target, with the library's own flags, and any such warning
fails. Compiling needs no CPU of that kind, so every target is checked on any machine."""
from __future__ import annotations

import re
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
        results = list(pool.map(compile_one, cpu_build.KERNELS.sources))
    for name, done in results:
        assert done.returncode == 0, f"{name} for {target}: {done.stderr[-2000:]}"
        assert "vector-operation-performance" not in done.stderr, f"{name} for {target}:\n{done.stderr[-3000:]}"


# A multiply-add with a memory operand: "vfmadd231ps 32(%rbx), %ymm2, %ymm5" (AT&T syntax, GCC's -S).
_FMA_FROM_MEMORY = re.compile(r"\tvfmadd\d{3}ps\t[-0-9]*\(%")


@pytest.mark.skipif(shutil.which(COMPILER) is None, reason="no C++ compiler")
@pytest.mark.parametrize("src", cpu_build.KERNELS.sources, ids=lambda p: p.name)
def test_zen_tuning_folds_no_more_loads_into_multiply_adds_than_generic_tuning(src, tmp_path):
    # GCC tuned for Zen 2/3 (-march=native there) folded each reused weight or query vector into every
    # multiply-add that reads it, one 32-byte load per multiply-add: the few-row linear and the prefill
    # attention then ran at 40-60% of what the same loops reach with the vector loaded once (EPYC
    # Zen 3, session 25; sarathi::in_register in cpu_common.h). Tuned generically they were not folded.
    def count(tune):
        out = tmp_path / f"{src.stem}{tune}.s"
        cmd = [COMPILER, *cpu_build.compile_flags("x86-64-v3", tune or None), "-S", str(src), "-o", str(out)]
        cmd.remove("-c")
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return len(_FMA_FROM_MEMORY.findall(out.read_text()))

    assert count("znver3") <= count("")
