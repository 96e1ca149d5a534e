"""Co-scheduled hybrid attention against sequential, peers and floors per batch, resumable."""
from __future__ import annotations

from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.engine_code import ATTENTION
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.attention import _value, agreement, failure_notes, measured_rows
from sarathi_lab.measure.profiling.hybrid_grid import (
    CONTENDERS,
    GRIDS,
    POD,
    POD_BY_PROGRAM,
    POD_X1,
    TARGET,
)

ROWS = "hybrid_attention.csv"
STEP = Declared(
    order=40, minutes=round(GRIDS["cuda"].estimate_s() / 60, 1), paths=ATTENTION,
    what="hybrid batches (a chunk of 256/512 beside 16/32 decodes at 1K/3K; LLaMA-13B and "
         "Mistral-7B heads, bf16): prefill and decode attention co-scheduled on each SM in one "
         "launch vs the engine's sequential kernels (one launch; chunk then decodes), "
         "SDPA/FlexAttention and the floors "
         "(measure/profiling/hybrid_attention.py; target 0.8x the sequential)")


def shape_metrics(row: dict, on_gpu: bool) -> list[Metric]:
    """One batch's metrics; the target holds only on a GPU."""
    shape = row["shape"]

    def rounded(key: str):
        value = _value(row.get(key))
        return None if value is None else round(value, 3)

    over = rounded("over_sequential")
    metrics = [Metric(f"hybrid_attention_over_sequential[{shape}]", over, "x", f"<= {TARGET}",
                      (over is not None and over <= TARGET) if on_gpu else None),
               Metric(f"hybrid_attention_control_over_sequential[{shape}]",
                      rounded("control_over_sequential"), "x"),
               Metric(f"hybrid_attention_over_best_peer[{shape}]", rounded("over_best_peer"), "x"),
               Metric(f"hybrid_attention_over_floor[{shape}]", rounded("over_floor"), "x"),
               Metric(f"hybrid_attention_floor_over_sequential_floor[{shape}]",
                      rounded("floor_over_sequential_floor"), "x")]
    for name in (*CONTENDERS, "floor", "sequential_floor"):
        if _value(row.get(f"{name}_ms")) is not None:
            metrics.append(Metric(f"hybrid_attention_{name}_ms[{shape}]",
                                  float(f"{row[f'{name}_ms']:.4g}"), "ms"))
    if _value(row.get(f"{POD}_plan_ms")) is not None:
        metrics.append(Metric(f"hybrid_attention_plan_ms[{shape}]",
                              float(f"{row[f'{POD}_plan_ms']:.3g}"), "ms"))
    return [*metrics, agreement(row, f"hybrid_attention_max_rel_diff[{shape}]", CONTENDERS)]


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    from sarathi_lab.measure.profiling.hybrid_attention import measure

    grid = GRIDS[ctx.device]
    rows, _, notes = measured_rows(ctx, grid, ROWS, measure, "batches")
    on_gpu = ctx.device == "cuda"
    met = sum(_value(r.get("over_sequential")) is not None and r["over_sequential"] <= TARGET
              for r in rows)
    metrics = [Metric("hybrid_attention_within_target", f"{met}/{len(rows)}", "", "all",
                      met == len(rows) if on_gpu else None)]
    for row in rows:
        metrics += shape_metrics(row, on_gpu)
    notes.append(f"{grid.dtype} on {ctx.device}: {len(rows)} hybrid batches (c: the last chunk of "
                 "a prompt of ctx tokens, b: decodes at ctx), "
                 f"median of {grid.reps} interleaved rounds"
                 + (", each call after an L2 flush, CUDA events" if on_gpu else
                    "; the kernels in Triton's interpreter: times say nothing"))
    notes.append(f"{POD}: prefill and decode work on separate programs of each SM, each claiming a "
                 f"lane of its SM; {POD_BY_PROGRAM}: lane = program id; {POD_X1}: one program a SM "
                 "(the control); over_sequential: over the faster of the engine's one launch and "
                 "its two (chunk, then decodes with decode tiles)")
    return metrics, notes + failure_notes(rows, CONTENDERS, "batches")
