"""The ``launch`` step: iterations eager and graphed against floors, memory, pod, kernels; and
the overlapped twins: each hybrid iteration large enough for nano-batches, whole and as two
nano-batches on two streams, each from a CUDA graph of that batch, over its physical floor
(``,overlap`` and ``,whole``), and the kernels per stream (timeline.csv)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from sarathi_lab.analysis.launch_grid import MORE_CONTEXTS, SHAPES, label
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.engine_code import ENGINE
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.env import ceilings, ceilings_or_measured
from sarathi_lab.model.floors import floor, memory_ceiling, sequential_floor
from sarathi_lab.model.shape import Shape

# From this many tokens the GEMMs fill whole 128-row tiles and fixed costs weigh little.
FULL_TOKENS = 256


def physical_target(chunk: int, decodes: int) -> float | None:
    """Target over the physical floor: 1.25x from FULL_TOKENS, 1.5x below (fixed costs weigh more);
    decodes are held to their KV floor by the attention step."""
    return None if chunk == 0 else 1.25 if chunk + decodes >= FULL_TOKENS else 1.5


def sequential_target(chunk: int, decodes: int) -> float | None:
    """Over the sequential floor (each kernel at its own floor in turn): 1.15x from FULL_TOKENS."""
    return 1.15 if chunk + decodes >= FULL_TOKENS else None


def _target(limit: float | None) -> str:
    return f"<= {limit}" if limit else ""


# How far a graph replay (padding, other GEMMs) or two nano-batches may stray from eager; stale
# inputs go far.
REL_DIFF = 0.05
COUNTED = ((256, 17), (0, 18))
KERNELS = "kernels.csv"
BREAKDOWN_REPS = {"cuda": 3, "cpu": 1}
TIMELINE = "timeline.csv"
# The tuned table's ``overlap`` entry the twins measured; the tune step installs it.
ENTRY = "overlap_entry.json"
COLUMNS = ["iteration", "source", "stream", "name", "start_us", "dur_us"]
# What two nano-batches must reach over the physical floor (and faster than the whole batch).
PHYSICAL_TARGET = 1.3


def _kernel_counts(llm, cases, context: int, cuda: bool) -> tuple[list[Metric], list[str]]:
    """Kernels a layer launches per counted shape: as the engine plans them, and as the profiler
    sees them on a GPU."""
    from sarathi_lab.measure.profiling.kernel_count import (
        STAGES,
        profiled_layer_kernels,
        static_counts,
    )

    metrics, counts = [], []
    for chunk, decodes in [(c, d) for c, d in COUNTED if (c, d) in cases]:
        key = label(chunk, decodes)
        static = static_counts(llm, chunk, decodes, context, llm.device)
        metrics += [Metric(f"kernels_per_layer_{name}[{key}]", len(static[name]))
                    for name in STAGES]
        counts.append(f"kernels a layer [{key}], static: "
                      + "; ".join(f"{n} {' '.join(static[n])}" for n in STAGES))
        if cuda:
            profiled = profiled_layer_kernels(llm, chunk, decodes, context)
            metrics += [Metric(f"kernels_per_layer_profiled_{name}[{key}]", profiled[name])
                        for name in STAGES]
    return metrics, counts


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    from sarathi_lab import LLM

    model, dtype, context, reps, cases = SHAPES[ctx.device]
    cuda = ctx.device == "cuda"
    # a capture that failed: the engine runs eagerly
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The largest chunk and a request per case, so the engine captures a graph for each.
        llm = LLM(model=model, dtype=dtype, device=ctx.device, scheduler="sarathi",
                  chunk_size=max(c for c, _ in cases),
                  max_batch_size=max(d + (c > 0) for c, d in cases),
                  max_model_len=max(context, *MORE_CONTEXTS[ctx.device]), seed=0)
    env, own_ceilings = ceilings_or_measured(ctx)
    metrics, skipped = [], []
    for chunk, decodes in cases:
        metrics += _iteration(llm, chunk, decodes, context, reps, env, cuda, context)
    for at in MORE_CONTEXTS[ctx.device]:
        try:
            for chunk, decodes in cases:
                metrics += _iteration(llm, chunk, decodes, at, reps, env, cuda, context)
        # out of KV blocks or memory
        except (RuntimeError, ValueError) as e:
            skipped.append(f"context {at}: stopped at {label(chunk, decodes, at)} "
                           f"({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''})")
    count_metrics, counts = _kernel_counts(llm, cases, context, cuda)
    metrics += count_metrics
    breakdown, breakdown_note = _kernel_breakdown(llm, cases, context, ctx.dir, ctx.device)
    metrics += breakdown
    graph_metrics, graphs = _graphs(llm, cuda)
    metrics += graph_metrics
    contexts = ", ".join(map(str, (context, *MORE_CONTEXTS[ctx.device])))
    timed = (f"{model} {dtype} on {ctx.device}: {', '.join(label(c, d) for c, d in cases)} (c: the "
             "last chunk of a prompt of the context's tokens, b: decodes at that context) at "
             f"contexts {contexts} (ctx= in the names, none at {context}); eager (runner.forward) "
             "and engine (executor.forward: its graph's replay where one holds the batch), "
             f"interleaved, median of {reps}; floors: physical max(compute, memory) of the whole "
             "iteration, sequential the sum of each kernel's own (model/floors.py), memory at "
             f"the {memory_ceiling(env)[1]} rate")
    contexts = (context, *MORE_CONTEXTS[ctx.device])
    overlap, overlap_note = overlapped(llm, cases, contexts, reps, env, cuda, ctx.dir)
    pod, pod_note = _co_scheduled(llm, cases, context, reps, env, cuda)
    metrics += overlap + pod
    notes = [timed, f"engine graphs: {graphs}", *counts, breakdown_note, *skipped, overlap_note,
             pod_note]
    notes += [f"warning: {w.message}" for w in caught if "capture" in str(w.message)]
    if own_ceilings:
        notes.append("floors at ceilings this step measured (the env step has not run)")
    return metrics, notes


def _graphs(llm, cuda: bool) -> tuple[list[Metric], str]:
    record = llm.cuda_graphs or {}
    before, after = record.get("reserved_before_bytes"), record.get("reserved_after_bytes")
    captured = record.get("graphs", len(record.get("decode_sizes", []))
                          + len(record.get("mixed_tokens", [])))
    metrics = [Metric("graphs_captured", captured, "", "> 0", bool(record) if cuda else None),
               Metric("graph_capture_s", record.get("capture_s"), "s"),
               Metric("graph_pool_mib", _mib(record.get("pool_bytes")), "MiB"),
               Metric("graph_reserved_mib", _mib(after - before if after is not None else None),
                      "MiB")]
    graphs = (f"decode sizes {record['decode_sizes']}, mixed token buckets "
              f"{record['mixed_tokens']} (each of up to {record['mixed_requests']} requests; "
              "attention split as each replayed batch's eager plan, one mixed graph a prefill "
              f"tile kind: {record.get('mixed_tiles')} as [tokens, rows, warps])"
              if record else "none captured (every forward eager)")
    return metrics, graphs


def _co_scheduled(llm, cases, context: int, reps: int, env: dict,
                  cuda: bool) -> tuple[list[Metric], str]:
    """The hybrid iterations of FULL_TOKENS or more co-scheduled; last, as graphs are recaptured."""
    hybrid = [(c, d) for c, d in cases if c and d and c + d >= FULL_TOKENS]
    if llm.model.backend.name != "triton" or not hybrid:
        return [], ("co-scheduled attention (attention_hybrid=pod) not timed: it needs the Triton "
                    "attention")
    llm.use_attention_hybrid("pod")
    metrics = []
    for chunk, decodes in hybrid:
        metrics += _iteration(llm, chunk, decodes, context, reps, env, cuda, context, variant="pod")
    return metrics, (f"co-scheduled (,pod): {', '.join(label(c, d) for c, d in hybrid)} again with "
                     "attention_hybrid=pod, eager and replayed from graphs of the co-scheduled "
                     f"launch ({(llm.cuda_graphs or {}).get('pod_graphs', 0)} captured)")


def _iteration(llm, chunk: int, decodes: int, context: int, reps: int, env: dict, cuda: bool,
               base: int, variant: str = "") -> list[Metric]:
    """One iteration's times, floors and ratios; ``variant`` (``pod``) named after the shape."""
    from sarathi_lab.measure.profiling.launch import measure

    row = measure(llm, chunk, decodes, context, reps)
    key = label(chunk, decodes, None if context == base else context)
    key += f",{variant}" if variant else ""
    at = _floor_args(llm, chunk, decodes, context, env)
    least, sequential = floor(*at).seconds * 1e3, sequential_floor(*at).seconds * 1e3
    engine_over, over_sequential = row["engine_ms"] / least, row["engine_ms"] / sequential
    target, seq_target = physical_target(chunk, decodes), sequential_target(chunk, decodes)
    return [
        Metric(f"eager_ms[{key}]", round(row["eager_ms"], 3), "ms"),
        Metric(f"engine_ms[{key}]", round(row["engine_ms"], 3), "ms"),
        Metric(f"floor_ms[{key}]", round(least, 3), "ms"),
        Metric(f"sequential_floor_ms[{key}]", round(sequential, 3), "ms"),
        Metric(f"eager_over_floor[{key}]", round(row["eager_ms"] / least, 2), "x"),
        Metric(f"engine_over_floor[{key}]", round(engine_over, 2), "x", _target(target),
               engine_over <= target if target and cuda else None),
        Metric(f"engine_over_sequential_floor[{key}]", round(over_sequential, 2), "x",
               _target(seq_target), over_sequential <= seq_target if seq_target and cuda else None),
        Metric(f"eager_over_engine[{key}]", round(row["eager_ms"] / row["engine_ms"], 2), "x"),
        Metric(f"engine_graph_tokens[{key}]", row["graph_tokens"], "",
               "> 0 (replayed from the engine's graph)", row["graph_tokens"] > 0 if cuda else None),
        Metric(f"engine_rel_diff[{key}]", float(f"{row['rel_diff']:.3g}"), "", f"< {REL_DIFF}",
               row["rel_diff"] < REL_DIFF)]


def _kernel_breakdown(llm, cases, context: int, out: Path, device: str) -> tuple[list[Metric], str]:
    """Per iteration kind, its kernels grouped and summed over the forward's GPU time."""
    import pandas as pd

    from sarathi_lab.measure.profiling.kernel_breakdown import breakdown_rows, profile_iteration

    cuda, reps = device == "cuda", BREAKDOWN_REPS[device]
    source = "cuda kernels" if cuda else "cpu ops (host work: no CUDA kernels off the GPU)"
    layers, rows, metrics, failed = llm.model_config.num_hidden_layers, [], [], []
    for chunk, decodes in cases:
        key = label(chunk, decodes)
        try:
            kernels, gpu_ms, wall_ms = profile_iteration(llm, chunk, decodes, context, reps)
        except RuntimeError as e:  # the profiler's own failure: the timings stand
            failed.append(f"{key} ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''})")
            continue
        got = breakdown_rows(key, kernels, reps, layers, chunk > 0, gpu_ms, wall_ms, source)
        rows += got
        forward = sum(r["total_ms"] for r in got if r["group"] != "sampling")
        over = forward / gpu_ms if gpu_ms else None
        metrics += [Metric(f"kernel_sum_ms[{key}]", round(forward, 3), "ms"),
                    Metric(f"kernel_sum_over_gpu_event[{key}]", over and round(over, 3), "x",
                           "0.95-1.05",
                           (over is not None and abs(over - 1) <= 0.05) if cuda else None),
                    Metric(f"iteration_host_ms[{key}]", round(wall_ms - gpu_ms, 3), "ms")]
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / KERNELS, index=False)
    return metrics, (f"per-kernel breakdown ({KERNELS}): {source} of {reps} executed iteration(s) "
                     f"a kind at context {context} under torch.profiler, grouped by name and place "
                     "in the layer (measure/profiling/kernel_breakdown.py); kernel_sum (less "
                     "sampling) over the forward's CUDA-event time; iteration_host_ms: the "
                     f"iteration's wall time less that, medians of {reps} unprofiled"
                     + (f"; not profiled: {', '.join(failed)}" if failed else ""))


def _floor_args(llm, chunk: int, decodes: int, context: int, env: dict) -> tuple:
    """model/floors.py's arguments for a chunk (0: none) beside ``decodes`` at ``context``."""
    queries = [chunk] * (chunk > 0) + [1] * decodes
    return (Shape.of(llm.model_config), queries, [context] * len(queries), len(queries),
            llm.dtype.itemsize, memory_ceiling(env)[0], env["matmul_tflops"] * 1e3)


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / 2**20, 1)


def overlapped(llm, cases, contexts, reps: int, env: dict, cuda: bool,
               out: Path) -> tuple[list[Metric], str]:
    """Every case of OVERLAP.min_tokens or more per context, the note; timelines to ``out``."""
    import pandas as pd

    from sarathi_lab.measure.profiling.overlap import OVERLAP, measure_overlap

    big = [(c, d) for c, d in cases if c and d and c + d >= OVERLAP.min_tokens]
    metrics, rows, stopped, gains = [], [], "", []
    for at in contexts:
        for chunk, decodes in big:
            key = label(chunk, decodes, None if at == contexts[0] else at)
            try:
                row, timeline = measure_overlap(llm, chunk, decodes, at, reps)
            except (RuntimeError, ValueError) as e:  # out of KV blocks or memory
                first = str(e).splitlines()[0][:200] if str(e) else ""
                stopped = f"; stopped at {key} ({type(e).__name__}: {first})"
                break
            metrics += _overlap_metrics(llm, key, chunk, decodes, at, row, env, cuda)
            metrics += _stream_metrics(key, timeline)
            gains.append((chunk + decodes, row["overlap_ms"] - row["whole_ms"]))
            rows += [{"iteration": key, **r} for r in timeline]
        if stopped:
            break
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(out / TIMELINE, index=False)
    if gains:
        (out / ENTRY).write_text(json.dumps(table_entry(gains)) + "\n")
    names = ", ".join(label(c, d) for c, d in big)
    return metrics, (
        f"overlapped twins (,overlap / ,whole): {names} at contexts "
        f"{', '.join(map(str, contexts))}, cut at half their {OVERLAP.tile}-row tiles into two "
        "nano-batches, one's attention on a side stream beside the other's GEMMs; each way a CUDA "
        f"graph of the batch itself (no bucket padding), median of {reps} interleaved; {TIMELINE}: "
        "the nano-batched forward's kernels per stream, one replay and one eager forward "
        f"(measure/profiling/overlap.py){stopped}")


def table_entry(gains: list[tuple[int, float]]) -> dict[str, bool | int]:
    """On from the fewest tokens from which every twin was faster overlapped; else off."""
    counts = sorted({t for t, _ in gains})
    won = [t for t in counts if all(g < 0 for u, g in gains if u >= t)]
    return {"enabled": True, "min_tokens": won[0]} if won else {"enabled": False}


def _overlap_metrics(llm, key: str, chunk: int, decodes: int, context: int, row: dict, env: dict,
             cuda: bool) -> list[Metric]:
    least_ms = floor(*_floor_args(llm, chunk, decodes, context, env)).seconds * 1e3
    over, whole = row["overlap_ms"] / least_ms, row["whole_ms"] / least_ms
    gain, rel = row["overlap_ms"] - row["whole_ms"], row["rel_diff"]
    return [
        Metric(f"engine_ms[{key},overlap]", round(row["overlap_ms"], 3), "ms"),
        Metric(f"engine_ms[{key},whole]", round(row["whole_ms"], 3), "ms"),
        Metric(f"engine_over_floor[{key},overlap]", round(over, 2), "x", f"<= {PHYSICAL_TARGET}",
               over <= PHYSICAL_TARGET if cuda else None),
        Metric(f"engine_over_floor[{key},whole]", round(whole, 2), "x"),
        Metric(f"overlap_gain_ms[{key}]", round(gain, 3), "ms", "< 0", gain < 0 if cuda else None),
        Metric(f"overlap_cut_tokens[{key}]", row["cut"], "", "> 0", row["cut"] > 0),
        Metric(f"overlap_rel_diff[{key}]", float(f"{rel:.3g}"), "", f"< {REL_DIFF}",
               rel < REL_DIFF),
        Metric(f"overlap_tokens_equal[{key}]", int(row["tokens_equal"]), "", "1",
               row["tokens_equal"])]


def _stream_metrics(key: str, timeline: list[dict]) -> list[Metric]:
    """Per source (graph replay, eager): the streams that ran kernels, the time two ran at once."""
    from sarathi_lab.measure.profiling.overlap import concurrent_ms, streams_busy_ms

    out = []
    for source in ("graph", "eager"):
        rows = [r for r in timeline if r["source"] == source]
        if rows:
            both = round(concurrent_ms(rows), 3)
            out += [Metric(f"overlap_streams[{key},{source}]", len(streams_busy_ms(rows))),
                    Metric(f"overlap_concurrent_ms[{key},{source}]", both, "ms")]
    return out


def figure(out: Path) -> bool:
    """Per iteration kind: kernels' ms stacked by group, the forward's idle GPU time, the host's."""
    import pandas as pd

    from sarathi_lab.measure.gpu.figure_file import pyplot, save
    from sarathi_lab.measure.profiling.kernel_breakdown import GROUPS

    path = state.step_dir(out, "launch") / KERNELS
    table = pd.read_csv(path) if path.is_file() else pd.DataFrame()
    if table.empty:
        return False
    order = list(dict.fromkeys(table.iteration))
    wide = table.pivot_table(index="iteration", columns="group", values="total_ms",
                             aggfunc="sum").reindex(order)
    wide = wide[[g for g in GROUPS if g in wide]].fillna(0.0)
    whole = table.groupby("iteration")[["iteration_gpu_ms",
                                        "iteration_wall_ms"]].first().reindex(order)
    sampling = wide.get("sampling", 0.0)
    kernels_ms = wide.sum(axis=1) - sampling
    wide["idle (in the forward)"] = (whole.iteration_gpu_ms - kernels_ms).clip(lower=0)
    wide["host"] = (whole.iteration_wall_ms - whole.iteration_gpu_ms - sampling).clip(lower=0)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3 + 0.6 * len(order), 5))
    colors = plt.get_cmap("tab20").colors
    bottom = pd.Series(0.0, index=wide.index)
    for group in wide.columns:  # same colour in every lease
        color = (colors[GROUPS.index(group) % 20] if group in GROUPS
                 else "dimgrey" if group == "host" else "gainsboro")
        ax.bar(range(len(order)), wide[group], bottom=bottom, color=color, label=group, width=0.7)
        bottom += wide[group]
    ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="ms per iteration")
    ax.grid(axis="y", alpha=0.3)
    measured = ", ".join(x for x in ((ceilings(out) or {}).get("device"), table.source.iloc[0])
                         if x)
    ax.set_title(f"Where each iteration's time goes, as the engine runs it\n({measured})",
                 fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out, "kernel_breakdown")
    return True


STEP = Declared(
    order=20, minutes=1.9, figure=figure, figure_name="kernel_breakdown",
    paths=(*ENGINE, "sarathi_lab/measure/profiling", "sarathi_lab/analysis/launch_grid.py"),
    what="LLaMA-13B bf16 at contexts 1024 and 3072: decode batches 1 and 18, chunks of 64-512 (a "
         "prompt's last) alone and beside 17 decodes, and the tile-aligned chunks beside 17 (111, "
         "239, 495): eager and as the engine runs it (its CUDA graphs), each over its physical "
         "floor (engine_over_floor targets 1.25x from 256 tokens, 1.5x below) and its sequential "
         "floor (engine_over_sequential_floor <= 1.15x from 256 tokens); graph memory, capture "
         "time; then c=256/512/239/495 + 17 again with their attention co-scheduled (,pod: eager "
         "and from graphs of that launch, recaptured); c=512/495 + 17 whole and as two "
         "nano-batches on two streams (,whole / ,overlap: graphs of the batch; timeline.csv per "
         "stream); per iteration kind at 1024, its kernels under torch.profiler grouped "
         "(kernels.csv, measure/profiling/kernel_breakdown.py) (estimate: 34 batches x 42 forwards "
         "of <= 60 ms, two captures and 8 of a batch, 21 profiles)")
