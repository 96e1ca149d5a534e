"""The engine's attention against peers and floor per ``attention_grid`` shape, resumable."""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import EngineConfig
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context, Incomplete
from sarathi_lab.measure.gpu.engine_code import ATTENTION
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.env import ceilings, ceilings_or_measured
from sarathi_lab.measure.profiling.attention_grid import (
    CONTENDERS,
    FLEX,
    FLOOR_TARGET,
    GRIDS,
    PEER_TARGET,
    floor_target,
)

if TYPE_CHECKING:  # imported where it runs: it loads the Triton kernels
    from sarathi_lab.measure.profiling.attention_peers import Flex

ROWS = "attention.csv"
# Not started with less than this left: the largest shape with its compile fits.
SHAPE_GUARD_S = 30


def _value(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def shape_metrics(row: dict, on_gpu: bool) -> list[Metric]:
    """One shape's metrics; targets hold only on a GPU (the CPU's are the interpreter's times)."""
    shape, kind = row["shape"], row["kind"]
    over_peer, over_floor = _value(row.get("over_best_peer")), _value(row.get("over_floor"))
    peer_target = f"<= {PEER_TARGET}" if kind != "decode" else ""
    floor_limit = floor_target(kind, _prefix(row))
    floor_shown = f"<= {floor_limit}" if floor_limit else ""

    def verdict(value, target: str, limit: float):
        return (value is not None and value <= limit) if target and on_gpu else None

    metrics = [Metric(f"attention_over_best_peer[{shape}]", over_peer and round(over_peer, 3), "x",
                      peer_target, verdict(over_peer, peer_target, PEER_TARGET)),
               Metric(f"attention_over_floor[{shape}]", over_floor and round(over_floor, 3), "x",
                      floor_shown, verdict(over_floor, floor_shown, floor_limit or 0.0))]
    for name in (*CONTENDERS, "floor"):
        if f"{name}_ms" in row and _value(row[f"{name}_ms"]) is not None:
            metrics.append(Metric(f"attention_{name}_ms[{shape}]",
                                  float(f"{row[f'{name}_ms']:.4g}"), "ms"))
    return [*metrics, agreement(row, f"attention_max_rel_diff[{shape}]", CONTENDERS)]


def agreement(row: dict, name: str, contenders) -> Metric:
    """The largest difference from attention/reference.py, holding where no contender erred."""
    diff = _value(row.get("max_rel_diff"))
    errors = [c for c in contenders if _value(row.get(f"{c}_error"))]
    return Metric(name, diff and float(f"{diff:.3g}"), "",
                  "every contender agrees with attention/reference.py", not errors)


def failure_notes(rows: list[dict], contenders, unit: str = "shapes") -> list[str]:
    """Per contender, the shapes where it failed or disagreed, by error; then the peers missing."""
    notes = []
    for name in contenders:
        by_error: dict[str, list[str]] = {}
        for r in rows:
            if error := _value(r.get(f"{name}_error")):
                by_error.setdefault(error, []).append(r["shape"])
        if by_error:
            failed = sum(map(len, by_error.values()))
            notes.append(f"{name} not timed at {failed} of {len(rows)} {unit}: "
                         + "; ".join(f"{e} at {', '.join(shapes)}"
                                     for e, shapes in by_error.items()))
    missing = sorted({p for r in rows for p in str(_value(r.get("peers_not_available"))
                                                   or "").split()})
    if missing:
        notes.append(f"not available on this device: {', '.join(missing)} (SDPA's cuDNN backend: "
                     "compute capability 9.0+ with cuDNN)")
    return notes


def _prefix(row: dict) -> int:
    """The cached tokens before a shape's queries."""
    return int(row.get("context", 0)) - int(row.get("query_len", 0))


def summary_metrics(rows: list[dict], on_gpu: bool) -> list[Metric]:
    """How many shapes meet each target, first (the suite's table shows them)."""
    def count(name: str, kinds: tuple[str, ...], column: str, limit: float) -> Metric:
        chosen = [r for r in rows if r["kind"] in kinds
                  and (column != "over_floor" or floor_target(r["kind"], _prefix(r)) is not None)]
        met = sum(_value(r.get(column)) is not None and r[column] <= limit for r in chosen)
        return Metric(name, f"{met}/{len(chosen)}", "", "all", met == len(chosen) if on_gpu
                      else None)

    return [count("attention_shapes_within_peer_target", ("prefill", "chunk"), "over_best_peer",
                  PEER_TARGET),
            count("attention_chunks_within_floor_target", ("chunk",), "over_floor",
                  FLOOR_TARGET["chunk"]),
            count("attention_decodes_within_floor_target", ("decode",), "over_floor",
                  FLOOR_TARGET["decode"])]


def measured_rows(ctx: Context, grid, rows_file: str, measure,
                  unit: str) -> tuple[list[dict], Flex, list[str]]:
    """A row per case of ``grid``, resuming from ``rows_file`` and rewriting it as each ends."""
    import pandas as pd
    import torch

    from sarathi_lab.measure.profiling.attention_peers import Flex

    device, dtype = torch.device(ctx.device), getattr(torch, grid.dtype)
    env, measured_here = ceilings_or_measured(ctx)
    notes = ["ceilings measured by this step (the env step has not run)"] if measured_here else []
    path = ctx.dir / rows_file
    rows = pd.read_csv(path).to_dict("records") if path.is_file() else []
    done = {r["shape"] for r in rows}
    flex = Flex(compiled=ctx.device == "cuda")
    # One compile per shape: Dynamo would give up past its default 8 and run eagerly.
    with torch._dynamo.config.patch(recompile_limit=grid.flex_compiles + 8):
        for case in [c for c in grid.cases() if c.label not in done]:
            left = ctx.seconds_left()
            if left is not None and left < SHAPE_GUARD_S:
                raise Incomplete(f"{len(rows)} of {len(grid.cases())} "
                                 f"{unit} measured; a rerun continues")
            rows.append(measure(case, dtype=dtype, device=device,
                                block_size=EngineConfig.block_size, reps=grid.reps,
                                warmup=grid.warmup, flex=flex, copy_gbps=env["copy_gbps"],
                                matmul_gflops=env["matmul_tflops"] * 1e3))
            pd.DataFrame(rows).to_csv(path, index=False)
    order = {c.label: i for i, c in enumerate(grid.cases())}
    rows.sort(key=lambda r: order.get(r["shape"], len(order)))
    return rows, flex, notes


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    from sarathi_lab.measure.profiling.attention_peers import measure

    grid = GRIDS[ctx.device]
    rows, flex, notes = measured_rows(ctx, grid, ROWS, measure, "shapes")
    on_gpu = ctx.device == "cuda"
    metrics = summary_metrics(rows, on_gpu)
    # A compiled FlexAttention's first call at a shape is its compile.
    compile_s = [r[f"{FLEX}_first_call_s"] for r in rows
                 if flex.compiled and _value(r.get(f"{FLEX}_first_call_s")) is not None]
    metrics += [Metric("sdpa_backend", rows[0]["sdpa_backend"] if rows else ""),
                Metric("flex_compiled", flex.compiled),
                Metric("flex_compiles", len(compile_s), "",
                       f"{grid.flex_compiles} (one a FlexAttention shape)" if flex.compiled
                       else ""), Metric("flex_compile_s", round(sum(compile_s), 1), "s")]
    for row in rows:
        metrics += shape_metrics(row, on_gpu)
    notes.append(f"{grid.dtype} on {ctx.device}: {len(rows)} shapes, median of {grid.reps} "
                 "interleaved rounds"
                 + (", each call after an L2 flush, CUDA events" if on_gpu else
                    "; the engine in Triton's interpreter, SDPA on its default backend (no flash "
                    "off CUDA), FlexAttention eager: times say nothing"))
    notes.append(f"the engine over cache blocks of {EngineConfig.block_size} scattered at random, "
                 "the peers over contiguous K/V")
    return metrics, notes + failure_notes(rows, CONTENDERS)



def figure(out: Path) -> bool:
    """Each shape's engine, peers and floor (ms, log scale), a panel per kind of shape."""
    import pandas as pd

    from sarathi_lab.measure.gpu.figure_file import pyplot, save
    from sarathi_lab.measure.profiling.attention_grid import KINDS

    path = state.step_dir(out, "attention") / ROWS
    if not path.is_file():
        return False
    table = pd.read_csv(path)
    kinds = [k for k in KINDS if (table.kind == k).any()]
    fig, axes = pyplot().subplots(1, len(kinds), figsize=(4 + 0.28 * len(table), 4.5),
                                  sharey=True, squeeze=False,
                                  gridspec_kw={"width_ratios": [max(2, (table.kind == k).sum())
                                                                for k in kinds]})
    styles = {"engine": ("o", "tab:blue"), "sdpa_flash": ("s", "tab:orange"),
              "sdpa_cudnn": ("D", "tab:red"), "flex": ("^", "tab:green")}
    for ax, kind in zip(axes[0], kinds):
        rows = table[table.kind == kind].reset_index(drop=True)
        for name in CONTENDERS:
            if f"{name}_ms" in rows:
                marker, color = styles[name]
                ax.scatter(rows.index, rows[f"{name}_ms"], marker=marker, color=color, s=22,
                           label=name, zorder=3)
        ax.scatter(rows.index, rows.floor_ms, marker="_", color="black", s=160, label="floor",
                   zorder=2)
        ax.set_xticks(rows.index, rows["shape"], rotation=90, fontsize=7)
        ax.set(yscale="log", title=kind)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("one layer's attention (ms)")
    device = (ceilings(out) or {}).get("device", table.device.iloc[0])
    fig.suptitle("One layer's attention: the engine vs its peers on the same q/k/v, and the "
                 f"floor\nmeasured: {device}, {table.dtype.iloc[0]} (sdpa_flash: "
                 f"{table.sdpa_backend.iloc[0]})", y=1.1)
    handles = {h.get_label(): h for ax in axes[0] for h in ax.collections}
    fig.legend(list(handles.values()), list(handles), fontsize=8, loc="lower center",
               bbox_to_anchor=(0.5, 0.93), ncol=len(handles))
    save(fig, out, "attention")
    return True


STEP = Declared(
    order=30, minutes=round(GRIDS["cuda"].estimate_s() / 60, 1), paths=ATTENTION,
    figure=figure, figure_name="attention",
    what="the engine's paged attention vs SDPA's flash and cuDNN (capability 9.0+) kernels and "
         "compiled FlexAttention on the same q/k/v, interleaved, and vs its floor: LLaMA-13B "
         "(40/40) and Mistral-7B (32/8) heads x 128, bf16; prefills 512-4096, chunks 64-512 at "
         "prefix 0/1K/3K, decode batches 1/18/64 at 512-4K (measure/profiling/attention_peers.py; "
         f"estimate: {GRIDS['cuda'].flex_compiles} FlexAttention compiles)")
