"""The ``tune`` step: attention tiles and split rule, cuBLAS or split-K, into the tuned table."""
from __future__ import annotations

import csv
import json

from sarathi_lab.config import EngineConfig
from sarathi_lab.harness.environment import device_name
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.launch import ENTRY
from sarathi_lab.model.presets import PRESETS
from sarathi_lab.model.shape import Shape

STEP = Declared(
    order=50, minutes=1.6, paths=("kernels/sarathi_kernels", "sarathi_lab/measure/profiling"),
    what="paged attention tile configs per work kind (prefill: chunks 256/512 at prefix 1K/3K and "
         "a 2K prefill; decode: b=18 at 1K, b=64 at 4K; 40/40 and 32/8 heads), split counts around "
         "the planner's; LLaMA-13B and Mistral-7B qkv/o_proj/gate_up/down at 128-1024 tokens, "
         "cuBLAS vs Triton split-K; writes the device's tuned table (measure/profiling/"
         "attention_sweep.py, gemm_sweep.py; estimate: ~70 compiles of ~1.5 s)")
# Not started with less than this left of the call.
GUARD_S = 20


def settings(device: str) -> tuple:
    """GPU: benchmark shapes, bf16, 10 rounds; dry run: tiny model, a round, two configs."""
    from sarathi_lab.measure.profiling.gemm_sweep import TOKENS

    return {"cuda": (("llama-13b", "mistral-7b"), TOKENS, "bfloat16", 10, 2, None),
            "cpu": (("tiny",), (16,), "float32", 1, 0, 2)}[device]


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    import torch

    from sarathi_lab.measure.profiling.attention_sweep import shapes
    from sarathi_lab.tuned_kernels import TunedTable, file_name

    models, tokens, dtype_name, reps, warmup, limit = settings(ctx.device)
    device, dtype = torch.device(ctx.device), getattr(torch, dtype_name)
    name = device_name(device)
    timing = {"dtype": dtype, "device": device, "reps": reps, "warmup": warmup, "limit": limit}
    tiles, rule, metrics = _tune_attention(ctx, timing)
    gemm, gemm_metrics, notes = _tune_gemm(ctx, models, tokens, timing)
    metrics += gemm_metrics

    table = TunedTable(name, tiles, gemm, split_rule=rule.moved_knobs(),
                       co_schedule=(co_schedule := _co_schedule(ctx)), overlap=_overlap(ctx))
    metrics.insert(0, Metric("co_schedule_shapes_faster",
                             sum(e["over_sequential"] < 1 for e in co_schedule)))
    path = ctx.dir / file_name(name)
    path.write_text(json.dumps(table.to_json(), indent=1) + "\n")
    metrics.insert(0, Metric("tuned_table", path.name))
    notes.insert(0, f"{dtype_name} on {ctx.device} ({name}): attention tiles per work kind over "
                 f"{sum(len(c) for c in shapes(ctx.device).values())} shapes, GEMMs of "
                 f"{', '.join(models)} at {', '.join(map(str, tokens))} "
                 f"tokens; median of {reps} interleaved rounds"
                 + (", each call after an L2 flush, CUDA events" if ctx.device == "cuda" else
                    " in Triton's interpreter: times say nothing"))
    notes.append(f"copy {path.name} to sarathi_lab/tuned/ to make the engine use it on this device")
    return metrics, notes


def _tune_attention(ctx: Context, timing: dict):
    """Each work kind's best tiles and the fitted split rule; the sweep's rows in
    tune_attention.csv."""
    import pandas as pd

    from sarathi_lab.measure.profiling.attention_sweep import (
        fit_split_rule,
        rule_label,
        shapes,
        sweep_kind,
        tiles_label,
    )

    tiles, metrics, attention_rows = {}, [], []
    for kind, cases in shapes(ctx.device).items():
        best, kept, rows = sweep_kind(kind, cases, block_size=EngineConfig.block_size,
                                      seconds_left=ctx.seconds_left, **timing)
        tiles[kind] = best
        attention_rows += rows
        metrics += [Metric(f"attention_tiles[{kind}]", tiles_label(best)),
                    Metric(f"attention_tuned_over_default[{kind}]", round(kept, 3), "x")]
    rule, gain = fit_split_rule(attention_rows)
    metrics += [Metric("split_rule", rule_label(rule)),
                Metric("split_rule_fitted_over_default", round(gain, 3), "x")]
    pd.DataFrame(attention_rows).to_csv(ctx.dir / "tune_attention.csv", index=False)
    return tiles, rule, metrics


def _tune_gemm(ctx: Context, models, tokens, timing: dict):
    """Each model's projections' best GEMM per token count, while the call's time lasts; the
    sweep's rows in tune_gemm.csv."""
    import pandas as pd
    import torch

    from sarathi_lab.measure.profiling.gemm_sweep import label, projections, sweep

    device = timing["device"]
    num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if ctx.device == "cuda" else None)
    gemm: dict[str, dict[int, object]] = {}
    metrics, notes, gemm_rows, skipped = [], [], [], 0
    for model in models:
        for proj in projections(Shape.of(PRESETS[model])):
            for m in tokens:
                left = ctx.seconds_left()
                if left is not None and left < GUARD_S:
                    skipped += 1
                    continue
                best, rows = sweep(proj, m, num_sms=num_sms, **timing)
                gemm.setdefault(proj.key, {})[m] = best
                gemm_rows += [r | {"model": model} for r in rows]
                by = {r["candidate"]: r.get("ms") for r in rows}
                key = f"{model}.{proj.name},m={m}"
                metrics += [Metric(f"gemm_choice[{key}]", label(best)),
                            Metric(f"gemm_best_over_cublas[{key}]",
                                   round(by[label(best)] / by["cublas"], 3), "x")]
    pd.DataFrame(gemm_rows).to_csv(ctx.dir / "tune_gemm.csv", index=False)
    if skipped:
        notes.append(f"{skipped} GEMM shapes not swept: the call's "
                     "time ran out (the table keeps cuBLAS there)")
    return gemm, metrics, notes


def _co_schedule(ctx: Context) -> list[dict]:
    """The hybrid step's shapes timed co-scheduled and sequential, where it ran (co_schedule.py)."""
    from sarathi_lab.attention.co_schedule import entries_from_rows

    rows = ctx.out / "steps" / "hybrid" / "hybrid_attention.csv"
    if not rows.is_file():
        return []
    with open(rows, newline="") as f:
        return entries_from_rows(list(csv.DictReader(f)))


def _overlap(ctx: Context) -> dict:
    """The launch step's overlapped twins' entry, where it ran (launch.table_entry)."""
    from sarathi_lab.tuned_kernels import overlap_entry

    path = ctx.out / "steps" / "launch" / ENTRY
    return overlap_entry(str(path), json.loads(path.read_text())) if path.is_file() else {}
