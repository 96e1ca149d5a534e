"""The simulator checked against the engine and against GPU measurements, in one place."""

# `python -m sarathi_lab.measure NAME` runs one; the listing gives its docstring's first line.
CHECKS = ("sim_validate", "sim_speed", "sim_process", "sim_pipeline", "sim_fidelity", "sim_vs_gpu",
          "floor_claims", "sim_chunk_align")
