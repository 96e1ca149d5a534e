"""Kernels of sarathi_lab: Triton paged attention and KV-cache write (``paged_attention``,
``kv_cache``), and the CPU kernels (plain C++ without Triton): paged attention (``cpu_attention``) and
fused elementwise ops (``cpu_ops``).

Nothing is imported here: the CPU path must never import Triton, and the Triton modules choose
compiler or interpreter when first imported (``triton_jit``), so each caller imports the module it uses.
"""
