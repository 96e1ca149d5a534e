"""Compiling our Triton kernels for a GPU target on a machine without one (through ptxas): what the
interpreter never does, so a kernel can run interpreted and still be rejected, or miscompiled, by
the compiler. Runs in a fresh interpreter with ``TRITON_INTERPRET=0``, which sarathi_kernels'
triton_jit honours over its own choice of the interpreter where there is no CUDA."""
from __future__ import annotations

import os
import subprocess
import sys

_HELPER = '''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def compile(kernel, types, constexprs, arch=80, aligned=(), **options):
    # Each argument typed from ``types``, else a pointer to int32 (``*_ptr``) or int32; the
    # upper-case arguments are the constexprs given. ``aligned``: the arguments a launch would find
    # divisible by 16 (a pointer's address in bytes, an integer's value), as Triton specialises them.
    sig = {n: "constexpr" if n.isupper() else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(kernel, sig, {(kernel.arg_names.index(k),): v for k, v in constexprs.items()}, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)

def spill_bytes(compiled, arch):
    """(registers, spill store bytes) of a compiled kernel, from ptxas -v on its PTX."""
    import re, subprocess, tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"  # Triton's own target names
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", ptx.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    return (int(re.search(r"Used (\\d+) registers", log).group(1)),
            int(re.search(r"(\\d+) bytes spill stores", log).group(1)))
'''


def compile_for_gpu(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` run after a ``compile(kernel, types, constexprs, arch=80, aligned=(), **options)``
    helper and ``spill_bytes(compiled, arch)`` (registers and spill stores, from ptxas), with ``args``
    as its sys.argv[1:]."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, "-c", _HELPER + script, *args], env=env, capture_output=True, text=True,
                          check=False)
