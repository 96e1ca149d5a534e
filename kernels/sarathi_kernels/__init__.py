"""Kernels of sarathi_lab: Triton paged attention and KV-cache write (``paged_attention``,
``kv_cache``), and the CPU paged-decode kernel (``cpu_decode``, plain C++ without Triton).

Nothing is imported here: the CPU path must never import Triton, and the Triton modules choose
compiler or interpreter when first imported (``triton_jit``), so each caller imports the module it uses.
"""
