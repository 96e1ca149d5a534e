"""What measuring the engine needs, below the harness and the benchmarks: one timer on the
engine's clock (timer), the machine's description and measured ceilings (machine, ceilings), the
roofline floor of an iteration (floors), hand-built iterations in a live engine's KV cache
(batches), attention metadata for standalone attention timing (attention), per-operation times of
a forward pass (ops), and the quantities the paper reads from such timings (quantities)."""
