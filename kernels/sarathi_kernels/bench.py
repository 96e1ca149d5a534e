"""Triton's timer (median of many launches after a warm-up, the L2 cache flushed between them), for
the lab's GPU kernel check: Triton is imported on the kernels' side only, so a CPU install never
meets it."""
from triton.testing import do_bench

__all__ = ["do_bench"]
