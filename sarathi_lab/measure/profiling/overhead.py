"""The engine's overhead, measured one way for ``bench overhead`` and the GPU suite."""
from __future__ import annotations

import statistics

import pandas as pd
import torch

from sarathi_lab.engine.metrics import iteration_kinds, overhead_fraction
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.engine.timer import make_clock, time_calls
from sarathi_lab.measure.profiling.batches import SyntheticBatches
from sarathi_lab.model.runner import batch_tensors

# The one definition every benchmark and the GPU suite judge: time outside the forward.
TARGET = 0.05
# With the forward they leave only the engine loop's bookkeeping untimed.
HOST_PARTS = ("schedule", "prepare", "sample")


def serve(llm, prompts, new_tokens) -> pd.DataFrame:
    """One row per iteration: its record, kind, overhead_fraction and host parts' share."""
    llm.generate(prompts, new_tokens, sampling=SamplingParams(ignore_eos=True))
    table = pd.DataFrame(llm.metrics.iteration_rows())
    table["kind"] = iteration_kinds(table.num_prefill_tokens, table.num_decode_tokens)
    table["host_share"] = table[[f"{part}_s" for part in HOST_PARTS]].sum(axis=1) / table.duration_s
    table["overhead_fraction"] = overhead_fraction(table.duration_s - table.forward_s,
                                                   table.forward_s)
    return table


def prepare_split(llm, decodes: int, context: int, reps: int) -> dict[str, float]:
    """Where prepare time goes: whole and host arrays alone, right after a forward (caches cold)."""
    runner, executor = llm.engine.executor.runner, llm.engine.executor
    host = make_clock("wall", "cpu")  # no device synchronisation inside the timed calls
    batches = SyntheticBatches(llm, seed=0)
    with batches.made(decodes=decodes, context=context) as batch:
        prepared = runner.prepare(batch)
        sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

        def after_forward() -> None:
            executor.forward(prepared)
            sync()

        # The numpy builder a device's batches take, without the copy.
        calls = {"prepare": lambda: runner.prepare(batch),
                 "host_arrays": lambda: batch_tensors(batch, runner.block_size, torch.device("cpu"),
                                                      runner.tables, decode_lists=False)}
        out = {}
        for name, call in calls.items():
            for when, before in (("hot", None), ("after_forward", after_forward)):
                times = time_calls(call, reps, host, before=before)
                out[f"{name}_us_{when}"] = statistics.median(times) * 1e6
        sync()
    return out
