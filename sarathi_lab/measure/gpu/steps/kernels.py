"""The compiled Triton kernels checked (own process), decode KV bandwidth over the copy ceiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.gpu import state
from sarathi_lab.measure.gpu.context import Context, Incomplete, Unavailable
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared
from sarathi_lab.measure.gpu.steps.env import ceilings
from sarathi_lab.measure.profiling.kernel_record import KernelCheck

CHECK = ("sarathi_lab.measure", "kernel_check")  # python -m, as a user starts it
FLOOR_TARGET = 1.5
# Decode-only batches: their time is reading the KV cache.
DECODE_CASE = " decodes x "


def metrics_of(check: KernelCheck, copy_gbps: float | None) -> list[Metric]:
    """Worst error per dtype and kernel, and each decode case's bandwidth over the copy floor."""
    if not check.attention:
        raise ValueError("the kernel check recorded no attention case (see check_gpu.log)")
    by_dtype = defaultdict(list)
    for case in check.attention:
        by_dtype[case.dtype].append(case)
    metrics = [Metric(f"attention_max_rel_err_{dtype}", max(c.rel_err for c in cases), "",
                      "kernels/README tolerance",
                      all(c.ok for c in cases)) for dtype, cases in by_dtype.items()]
    kinds = defaultdict(list)
    for kind, rows in (("kv_write", check.kv_writes), ("pointwise", check.pointwise)):
        for row in rows:
            kinds[f"{kind}_{row.dtype}"].append(row.ok)
    metrics += [Metric(f"{k}_cases_ok", f"{sum(v)}/{len(v)}", "", "all", all(v))
                for k, v in kinds.items()]
    if check.timed_case:
        metrics.append(Metric("decode_timed_case",
                              f"Triton paged attention, {check.timed_case}, {check.timed_dtype}"))
    if copy_gbps is None and check.copy_gbps is not None:
        copy_gbps = float(round(check.copy_gbps))  # GB/s as the check shows it
    for timing in check.timings:
        if DECODE_CASE not in timing.case or not copy_gbps:
            continue
        # GB/s as the check shows them
        name, gbps = timing.case.replace(" ", "_"), float(round(timing.gbps))
        metrics.append(Metric(f"decode_kv_gbps[{name}]", gbps, "GB/s"))
        ratio = copy_gbps / gbps
        metrics.append(Metric(f"decode_time_over_floor[{name}]", round(ratio, 2), "x",
                              f"<= {FLOOR_TARGET}", ratio <= FLOOR_TARGET))
    return metrics


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    if ctx.device != "cuda":
        if ctx.dry_run:
            return [Metric("compiled_kernels",
                           "skipped: no CUDA in the dry run; the interpreter path is "
                           "tests/test_kernels.py")], []
        raise Unavailable("no CUDA device: the kernel check runs compiled kernels")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    log, result = ctx.dir / "check_gpu.log", ctx.dir / "kernel_check.json"
    result.unlink(missing_ok=True)
    try:
        proc = subprocess.run([sys.executable, "-m", *CHECK, "--json", str(result)],
                              cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=ctx.seconds_left(),
                              check=False)
    except subprocess.TimeoutExpired as e:
        log.write_text((e.stdout or b"").decode() if isinstance(e.stdout, bytes)
                       else (e.stdout or ""))
        raise Incomplete("the kernel check ran past the call's budget") from e
    log.write_text(proc.stdout + proc.stderr)
    if not result.is_file():
        last = (proc.stderr.strip().splitlines() or ["no error printed"])[-1]
        raise RuntimeError(f"the kernel check exited {proc.returncode} before any check: {last} "
                           "(see check_gpu.log)")
    record = ceilings(ctx.out)
    metrics = metrics_of(KernelCheck.from_dict(json.loads(result.read_text())), record["copy_gbps"]
                         if record else None)
    metrics.append(Metric("check_gpu_exit", proc.returncode, "", "0", proc.returncode == 0))
    notes = [] if record else [("copy ceiling from the kernel check's "
                                "own measure (the env step has not run)")]
    return metrics, notes


def figure(out: Path) -> bool:
    """Decode attention's KV bandwidth against the env step's copy ceiling."""
    from sarathi_lab.analysis.gpu_records import is_number
    from sarathi_lab.measure.gpu.figure_file import pyplot, save

    result, env = state.read_result(out, "kernels"), ceilings(out)
    metrics = result.metrics if result else []
    # Read back through gpu_records: a rate that is not a number is no bar.
    rates = {m.metric.split("[")[1].rstrip("]").replace("_", " "): m.value for m in metrics
             if m.metric.startswith("decode_kv_gbps[") and is_number(m.value)}
    case = next((m.value for m in metrics if m.metric == "decode_timed_case"),
                "Triton paged attention")
    copy = (env or {}).get("copy_gbps")
    if not rates or not is_number(copy):
        return False
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    ax.barh(list(rates), list(rates.values()), color="tab:blue", label="paged attention, decode")
    ax.axvline(copy, color="black", ls="--", label=f"copy ceiling {copy:.0f} GB/s")
    ax.axvline(copy / 1.5, color="grey", ls=":", label="target: 1.5x of the floor")
    ax.set(xlabel="KV bytes read / s (GB/s)",
           title="Decode attention bandwidth, measured GPU: "
                 f"{env.get('device', 'unknown device')}\n{case}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    save(fig, out, "kernels")
    return True


# Kernel correctness last: it runs in its own process.
STEP = Declared(
    order=80, minutes=3.0, figure=figure, figure_name="kernels",
    paths=("kernels", "sarathi_lab/measure/profiling/kernel_check.py",
           "sarathi_lab/measure/profiling/kernel_record.py"),
    what="measure/profiling/kernel_check.py: Triton paged attention vs the torch backend in "
         "fp32/fp16/bf16 "
         "(kernels/README tolerances), decode KV bandwidth vs the copy ceiling (target 1.5x)")
