"""The GPU suite's ``launch`` step: ``profiling.launch`` on LLaMA-13B's decode batches and on prefill
chunks alone and beside decodes, each eager and as the engine runs it (an LLM with its CUDA graphs
on), beside its floor (weights, KV cache and flops at the ceilings the env step measured); the
engine's graphs' memory and capture time."""
from __future__ import annotations

import warnings

from sarathi_lab import LLM
from sarathi_lab.gpu.context import Context
from sarathi_lab.gpu.state import Metric
from sarathi_lab.gpu.steps.env import ceilings, measure_ceilings
from sarathi_lab.model.shape import Shape
from sarathi_lab.profiling.floors import floor
from sarathi_lab.profiling.launch import SHAPES, label, measure

# The engine's forward over its floor that a chunk's iteration must reach (the targets): the
# launch floor gone, within 1.25x from 256 tokens and 1.5x below, where fixed costs weigh more.
TARGET = {64: 1.5, 128: 1.5, 256: 1.25, 512: 1.25}
# How far the engine's output (a graph of the padded batch, whose GEMMs may take other kernels) may
# stray from the eager forward's: a replay of stale inputs would be far off.
REL_DIFF = 0.05


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    model, dtype, context, reps, cases = SHAPES[ctx.device]
    cuda = ctx.device == "cuda"
    with warnings.catch_warnings(record=True) as caught:  # a capture that failed: the engine runs eagerly
        warnings.simplefilter("always")
        # The largest chunk and a request per case, so that the engine captures a graph for each case.
        llm = LLM(model=model, dtype=dtype, device=ctx.device, scheduler="sarathi",
                  chunk_size=max(c for c, _ in cases), max_batch_size=max(d + (c > 0) for c, d in cases),
                  max_model_len=context, seed=0)
    shape, elem = Shape.of(llm.model_config), llm.dtype.itemsize
    env = ceilings(ctx.out)
    own_ceilings = env is None
    env = env or measure_ceilings(ctx.device)
    metrics = []
    for chunk, decodes in cases:
        row, key = measure(llm, chunk, decodes, context, reps), label(chunk, decodes)
        queries = [chunk] * (chunk > 0) + [1] * decodes
        least = floor(shape, queries, [context] * len(queries), len(queries), elem, env["copy_gbps"],
                      env["matmul_tflops"] * 1e3).seconds * 1e3
        engine_over, target = row["engine_ms"] / least, TARGET.get(chunk)
        metrics += [
            Metric(f"eager_ms[{key}]", round(row["eager_ms"], 3), "ms"),
            Metric(f"engine_ms[{key}]", round(row["engine_ms"], 3), "ms"),
            Metric(f"floor_ms[{key}]", round(least, 3), "ms"),
            Metric(f"eager_over_floor[{key}]", round(row["eager_ms"] / least, 2), "x"),
            Metric(f"engine_over_floor[{key}]", round(engine_over, 2), "x", f"<= {target}" if target else "",
                   engine_over <= target if target and cuda else None),
            Metric(f"eager_over_engine[{key}]", round(row["eager_ms"] / row["engine_ms"], 2), "x"),
            Metric(f"engine_graph_tokens[{key}]", row["graph_tokens"], "", "> 0 (replayed from the engine's graph)",
                   row["graph_tokens"] > 0 if cuda else None),
            Metric(f"engine_rel_diff[{key}]", float(f"{row['rel_diff']:.3g}"), "", f"< {REL_DIFF}",
                   row["rel_diff"] < REL_DIFF)]
    record = llm.cuda_graphs or {}
    before, after = record.get("reserved_before_bytes"), record.get("reserved_after_bytes")
    captured = record.get("graphs", len(record.get("decode_sizes", [])) + len(record.get("mixed_tokens", [])))
    metrics += [Metric("graphs_captured", captured, "", "> 0", bool(record) if cuda else None),
                Metric("graph_capture_s", record.get("capture_s"), "s"),
                Metric("graph_pool_mib", _mib(record.get("pool_bytes")), "MiB"),
                Metric("graph_reserved_mib", _mib(after - before if after is not None else None), "MiB")]
    graphs = (f"decode sizes {record['decode_sizes']}, mixed token buckets {record['mixed_tokens']} (each of up to "
              f"{record['mixed_requests']} requests; attention split as each replayed batch's eager plan, one mixed "
              f"graph a prefill tile kind: {record.get('mixed_tiles')} as [tokens, rows, warps])"
              if record else "none captured (every forward eager)")
    timed = (f"{model} {dtype} on {ctx.device}: {', '.join(label(c, d) for c, d in cases)} (c: the last chunk of a "
             f"{context}-token prompt, b: decodes at context {context}); eager (runner.forward) and engine "
             f"(executor.forward: its graph's replay where one holds the batch), interleaved, median of {reps}")
    notes = [timed, f"engine graphs: {graphs}"]
    notes += [f"warning: {w.message}" for w in caught if "capture" in str(w.message)]
    if own_ceilings:
        notes.append("floors at ceilings this step measured (the env step has not run)")
    return metrics, notes


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / 2**20, 1)
