"""The engine's time outside the forward per decode-only and hybrid iteration, LLaMA-13B."""
from __future__ import annotations

import statistics
from pathlib import Path

from sarathi_lab.engine.metrics import STALL, stalled
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.engine_code import ENGINE
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.env import ceilings

# model, dtype, requests, prompt and new tokens, chunk: each prompt 4 chunks on the GPU.
SHAPES = {"cuda": ("llama-13b", "bfloat16", 18, 1024, 128, 256),
          "cpu": ("tiny", "float32", 4, 64, 16, 32)}


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    import torch
    from sarathi_kernels.chunk_plan import plan_cache_counts

    from sarathi_lab import LLM
    from sarathi_lab.measure.profiling.overhead import TARGET, prepare_split, serve

    model, dtype, n, prompt_len, new, chunk = SHAPES[ctx.device]
    llm = LLM(model=model, scheduler="sarathi", chunk_size=chunk, max_batch_size=n,
              device=ctx.device, dtype=dtype, max_model_len=prompt_len + new, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, llm.model_config.vocab_size, (n, prompt_len), generator=gen).tolist()
    before = plan_cache_counts()
    table = serve(llm, prompts, new)
    table.to_csv(ctx.dir / "iterations.csv", index=False)
    # Balanced attention work planned on the host (on the critical path or ahead, under a forward):
    # lookups and the plans made, to read the iterations' host time beside.
    after = plan_cache_counts()
    metrics = [Metric("attention_plan_lookups", sum(after.values()) - sum(before.values())),
               Metric("attention_plans_made", after["misses"] - before["misses"])]
    for kind, label in (("decode", f"decode-only at batch {n}"), ("hybrid", "hybrid")):
        rows = table[(table.kind == kind) & ((table.num_decode_requests == n) if kind == "decode"
                                             else True)]
        if rows.empty:
            continue
        # A kernel compiled mid-run stalls its iteration for the whole compile.
        forwards = table[table.kind == kind].forward_s
        stalls = int(stalled(forwards, [kind] * len(forwards)).sum())
        share = statistics.median(rows.overhead_fraction)
        metrics += [Metric(f"overhead_fraction_median[{kind}]", round(share, 4), "",
                           f"< {TARGET} ({label})", share < TARGET if kind == "decode" else None),
                    Metric(f"overhead_fraction_p90[{kind}]",
                           round(rows.overhead_fraction.quantile(0.9), 4)),
                    Metric(f"host_share_median[{kind}]",
                           round(statistics.median(rows.host_share), 4)),
                    Metric(f"iteration_ms_median[{kind}]",
                           round(statistics.median(rows.duration_s) * 1e3, 3), "ms"),
                    Metric(f"stalled_iterations[{kind}]", stalls, "",
                           f"0 (none over {STALL:g}x the median forward)",
                           stalls == 0 if ctx.device == "cuda" else None),
                    Metric(f"iterations[{kind}]", len(rows))]
    # A decode's prepare time: building host arrays or copying them, hot or after a forward.
    split = prepare_split(llm, n, prompt_len, reps=20)
    metrics += [Metric(f"{key}[decode]", round(value, 1), "us") for key, value in split.items()]
    captured = (llm.cuda_graphs or {}).get("decode_sizes", [])
    metrics.append(Metric("cuda_graphs_captured", len(captured), "",
                          "> 0 (decode forwards replay graphs)",
                          bool(captured) if ctx.device == "cuda" else None))
    notes = [(f"{model} {dtype} on {ctx.device}: {n} requests of {prompt_len} + {new} tokens, "
              f"sarathi chunk {chunk}")]
    return metrics, notes


def figure(out: Path) -> bool:
    """Each iteration's share outside the forward pass against the target."""
    import pandas as pd

    from sarathi_lab.harness.results import current_names
    from sarathi_lab.measure.gpu.figure_file import pyplot, save
    from sarathi_lab.measure.profiling.overhead import TARGET

    path = state.step_dir(out, "overhead") / "iterations.csv"
    if not path.is_file():
        return False
    # a suite's older files under today's names
    table = pd.read_csv(path).rename(columns=current_names)
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    for kind, rows in table.groupby("kind"):
        ax.scatter(rows.iteration, 100 * rows.overhead_fraction, s=8, label=kind)
    ax.axhline(100 * TARGET, color="black", ls="--", label=f"target {TARGET:.0%}")
    result = state.read_result(out, "overhead")
    shape = result.notes[0] if result and result.notes else ""
    device = (ceilings(out) or {}).get("device", "unknown device")
    ax.set(xlabel="iteration", ylabel="time outside the forward pass (%)",
           title=f"Engine overhead per iteration, measured GPU: {device}\n{shape}")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save(fig, out, "overhead")
    return True


STEP = Declared(
    order=70, minutes=0.2, figure=figure, figure_name="overhead",
    paths=(*ENGINE, "sarathi_lab/measure/profiling"),
    what="LLaMA-13B bf16, sarathi chunk 256, 18 requests of 1024 + 128 tokens: "
         "each decode-only and hybrid iteration's time outside "
         "the forward pass (target < 5%), and its stalls")
