"""task=capacity: Sarathi-Serve's capacity on one engine, every trial the same requests on one
arrival pattern scaled to its rate, a run of its own. The search is deterministic given its
verdicts, so a rerun reuses the finished trials of the same config."""
from __future__ import annotations

import json
import logging
import math
import shutil

import pandas as pd

from sarathi_lab.harness.capacity import Trial, search_capacity, serve_trial
from sarathi_lab.harness.results import (
    CAPACITY_JSON,
    METRICS,
    UnreadableRun,
    read_record,
    write_json,
)
from sarathi_lab.harness.tasks import TaskContext
from sarathi_lab.harness.workloads import arrivals_at

log = logging.getLogger(__name__)

TAKES_CONTEXT = True  # every trial is a serving run of its own

# What the trials table and the summary keep of each trial.
TRIAL_COLUMNS = ("itl_p99_s", "sched_delay_p50_s", "ttft_p50_s", "tpot_p50_s", "goodput_rps",
                 "slo_attainment", "saturated", "num_unfinished", "makespan_s")


def trial_requests(search, qps: float, available: int) -> int:
    """Its arrival window's worth of the workload's requests."""
    if search.trial_s is None:
        return available
    return min(available, max(search.min_requests, math.ceil(qps * search.trial_s)))


def run(cfg, llm, context: TaskContext) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    slo, workload, search = cfg.slo.as_slo(), context.workload, cfg.capacity
    rows: list[dict] = []

    def trial(qps: float) -> Trial:
        k, name = len(rows), f"trial-{len(rows)}-qps{qps:.4g}"
        n = trial_requests(search, qps, workload.num_requests)
        result = _finished_trial(context, name, k, qps)
        if result is None:
            arrivals = arrivals_at(cfg.workload, workload, qps, cfg.seed)
            try:
                result = serve_trial(llm, workload.prompts[:n], workload.decode_lens[:n],
                                     arrivals and arrivals[:n], slo, qps, search.require_stable,
                                     max_concurrency=workload.max_concurrency)
            except KeyboardInterrupt:
                context.record_run(context.run_dir / name, name,
                                   llm.metrics.summary(slo) | {"rate_rps": qps},
                                   llm.metrics, {"trial": k, "qps": qps}, partial=True)
                raise
            # A trial stopped early has latencies, goodput and attainment over its finished only.
            summary = result.summary | {"rate_rps": qps, "passed": float(result.passed),
                                        "stopped_early": float(result.stopped_early),
                                        "binding": result.binding}
            context.record_run(context.run_dir / name, name, summary, llm.metrics,
                               {"trial": k, "qps": qps})
            how = " (stopped early)" if result.stopped_early else ""
        else:
            how = f", reused from {name} (finished before an interruption)"
        rows.append({"trial": k, "rate_rps": qps, "requests": n, "passed": result.passed,
                     "binding": result.binding, "stopped_early": result.stopped_early,
                     "run_dir": name}
                    | {c: result.summary.get(c, math.nan) for c in TRIAL_COLUMNS})
        verdict = "passed" if result.passed else f"missed {result.binding}"
        log.info("trial %d at %.4g req/s: %s%s", k, qps, verdict, how)
        return result

    try:
        found = search_capacity(trial, search)
    except KeyboardInterrupt:
        context.save_partial({"num_trials": len(rows)}, {"trials": pd.DataFrame(rows)})
        raise
    _write_record(context.run_dir, found, rows, slo, search)
    if not found.resolved:
        log.warning("capacity search stopped before its resolution: %s", _why(found, search))
    log.info("%s", found.describe())
    return _summary(found, rows, workload), {"trials": pd.DataFrame(rows)}


def _write_record(run_dir, found, rows: list[dict], slo, search) -> None:
    """capacity.json; an earlier search's trials this one did not reach go."""
    slos = {"tbt_p99_s": slo.tbt_p99_s, "sched_delay_p50_s": slo.sched_delay_p50_s}
    record = found.as_dict() | {"slo": slos, "require_stable": search.require_stable}
    for entry, row in zip(record["trials"], rows):
        entry["run_dir"] = row["run_dir"]
    write_json(run_dir / CAPACITY_JSON, record)
    used = {row["run_dir"] for row in rows}
    for stale in run_dir.glob("trial-*"):
        if stale.name not in used:
            shutil.rmtree(stale)


def _summary(found, rows: list[dict], workload) -> dict[str, float]:
    best = next((r for r in rows if r["passed"] and r["rate_rps"] == found.capacity_rps), {})
    summary = {"capacity_rps": found.capacity_rps if found.capacity_rps is not None else math.nan,
               "resolution": found.resolution if found.resolution is not None else math.nan,
               "requested_resolution": found.requested_resolution, "bounded": float(found.bounded),
               "resolved": float(found.resolved),
               "binding": found.binding, "num_trials": len(found.trials)} \
        | {f"at_capacity_{c}": best.get(c, math.nan) for c in TRIAL_COLUMNS}
    if workload.recorded_rate_rps is not None:
        # On a replayed trace the capacity is also a multiple of its recorded rate.
        summary |= {"trace_rate_rps": workload.recorded_rate_rps,
                    "capacity_rate_scale": summary["capacity_rps"] / workload.recorded_rate_rps}
    return summary


def _finished_trial(context: TaskContext, name: str, k: int, qps: float) -> Trial | None:
    path = context.run_dir / name / METRICS
    if not path.is_file():
        return None
    try:
        record = read_record(path)
    except UnreadableRun as e:
        log.warning("%s; trial %d is measured again", e, k)
        return None
    summary = record["summary"]
    # As metrics.json holds it (JSON: tuples as lists).
    config = json.loads(json.dumps(context.resolved_config, default=str))
    if record.get("partial", True) or record["resolved_config"] != config or \
            record["config"].get("trial") != k or record["config"].get("qps") != qps \
            or "binding" not in summary:
        return None
    return Trial(qps, passed=bool(summary["passed"]), binding=summary["binding"],
                 stopped_early=bool(summary["stopped_early"]), summary=summary)


def _why(found, search) -> str:
    tried = [t.rate_rps for t in found.trials]
    if found.capacity_rps is None and min(tried) <= search.min_qps:
        return f"even the lowest rate, capacity.min_qps={search.min_qps}, failed"
    if not found.bounded and max(tried) >= search.max_qps:
        return (f"every rate up to capacity.max_qps={search.max_qps} passed: "
                f"capacity >= {found.capacity_rps}")
    return f"capacity.max_trials={search.max_trials} ran out"
