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

def compile(kernel, types, constexprs, arch=80, **options):
    # Each argument typed from ``types``, else a pointer to int32 (``*_ptr``) or int32; the
    # upper-case arguments are the constexprs given.
    sig = {n: "constexpr" if n.isupper() else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
           for n in kernel.arg_names}
    src = ASTSource(kernel, sig, {(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
'''


def compile_for_gpu(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` run after a ``compile(kernel, types, constexprs, arch=80, **options)`` helper, with
    ``args`` as its sys.argv[1:]."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, "-c", _HELPER + script, *args], env=env, capture_output=True, text=True,
                          check=False)
