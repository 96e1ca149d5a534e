"""Triton kernels of sarathi_lab: paged varlen attention over hybrid batches, and the KV-cache write.

Compiled Triton needs a GPU; without one the kernels can only run in Triton's interpreter. Triton
picks interpreter or compiler when a function is decorated, its own library included, so
TRITON_INTERPRET=1 must be set before ``triton.language`` is first imported, and importing
transformers (torch._dynamo) imports it. Set here, it works only if nothing imported Triton first;
otherwise the import fails with the fix rather than letting a kernel fail mid-run.
"""
import importlib
import os

import torch


def __getattr__(name: str):
    # Triton loads only when a Triton kernel is asked for: the CPU path (cpu_decode) never needs it.
    if name not in ("paged_attention", "write_kv_cache"):
        raise AttributeError(f"module 'sarathi_kernels' has no attribute {name!r}")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if os.environ.get("TRITON_INTERPRET") == "1" and isinstance(tl.zeros, JITFunction):
        raise ImportError("TRITON_INTERPRET=1 was set after triton was imported (transformers imports it); "
                          "export TRITON_INTERPRET=1 or set it before importing sarathi_lab or transformers")
    kv_cache = importlib.import_module("sarathi_kernels.kv_cache")
    paged_attention = importlib.import_module("sarathi_kernels.paged_attention")

    # Importing the submodule paged_attention set the package's attribute to the module: the
    # function must replace it.
    kernels = {"paged_attention": paged_attention.paged_attention, "write_kv_cache": kv_cache.write_kv_cache}
    globals().update(kernels)
    return kernels[name]


__all__ = ["paged_attention", "write_kv_cache"]
