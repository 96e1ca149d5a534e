"""The engine's overhead, measured one way for ``bench overhead`` and the GPU suite: a workload served
through ``LLM.generate``, each iteration's time split into the parts IterationRecord holds."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.engine.metrics import iteration_kinds, overhead_fraction
from sarathi_lab.engine.sequence import SamplingParams

# The target for an iteration's overhead_fraction, the one definition every benchmark and the GPU
# suite judge: its time outside the model's forward pass over its whole time (the engine's summary
# keeps the same quotient over a run).
TARGET = 0.05
# The host's parts of an iteration, each timed on its own: with the forward pass they leave only the
# engine loop's bookkeeping untimed.
HOST_PARTS = ("schedule", "prepare", "sample")


def serve(llm, prompts, new_tokens) -> pd.DataFrame:
    """Serves the prompts (greedy, every new token) and returns one row per iteration: the engine's
    iteration record (iterations.parquet's columns), its kind (prefill, decode or hybrid), its
    ``overhead_fraction`` and, of that, the share its timed host parts (schedule + prepare + sample) take."""
    llm.generate(prompts, new_tokens, sampling=SamplingParams(ignore_eos=True))
    table = pd.DataFrame(llm.metrics.iteration_rows())
    table["kind"] = iteration_kinds(table.num_prefill_tokens, table.num_decode_tokens)
    table["host_share"] = table[[f"{part}_s" for part in HOST_PARTS]].sum(axis=1) / table.duration_s
    table["overhead_fraction"] = overhead_fraction(table.duration_s - table.forward_s, table.forward_s)
    return table
