"""Micro-benchmarks of single engine pieces, reused by the experiments."""
