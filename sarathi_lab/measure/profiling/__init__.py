"""What measuring the engine needs, below the harness and the benchmarks."""
