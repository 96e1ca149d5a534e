"""The engine's overhead, measured one way for ``bench overhead`` and the GPU suite: a workload served
through ``LLM.generate``, each iteration's time split into the parts IterationRecord holds."""
from __future__ import annotations

import statistics

import pandas as pd
import torch

from sarathi_lab.engine.metrics import iteration_kinds, overhead_fraction
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.engine.timer import make_clock, time_calls
from sarathi_lab.model.runner import batch_tensors
from sarathi_lab.profiling.batches import SyntheticBatches

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
    table["overhead_fraction"] = overhead_fraction(table.duration_s - table.forward_s,
                                                   table.forward_s)
    return table


def prepare_split(llm, decodes: int, context: int, reps: int) -> dict[str, float]:
    """Median microseconds of preparing one decode-only batch (``decodes`` at ``context``) the way the
    engine's device takes it: ``prepare`` whole (host arrays, then their copy to the device) and
    ``host_arrays`` alone (the same builder with the device left out), each ``hot`` (back to back) and
    ``after_forward`` (right after a forward, as in a served iteration, where the host's caches have
    gone cold): where an iteration's prepare time goes."""
    runner, executor = llm.engine.executor.runner, llm.engine.executor
    host = make_clock("wall", "cpu")  # no device synchronisation inside the timed calls
    batches = SyntheticBatches(llm, seed=0)
    with batches.made(decodes=decodes, context=context) as batch:
        prepared = runner.prepare(batch)
        sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

        def after_forward() -> None:
            executor.forward(prepared)
            sync()

        # The numpy builder a device's batches take, over the runner's kept block tables, without the copy.
        calls = {"prepare": lambda: runner.prepare(batch),
                 "host_arrays": lambda: batch_tensors(batch, runner.block_size, torch.device("cpu"),
                                                      runner.tables, decode_lists=False)}
        out = {}
        for name, call in calls.items():
            for when, before in (("hot", None), ("after_forward", after_forward)):
                out[f"{name}_us_{when}"] = statistics.median(time_calls(call, reps, host, before=before)) * 1e6
        sync()
    return out
