"""``task=pipeline_bubbles``: SARATHI's Fig. 12 on a real pipeline, measured bubbles (from the
executor's timeline, by the simulator's own definition in engine/bubbles.py) beside the same run
served by the simulated pipeline on this device's ``task=profile`` table."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import numpy as np
import pandas as pd

from sarathi_lab.config import AS_WRITTEN, ConfigError, Written
from sarathi_lab.engine.bubbles import micro_batch_bubbles, request_bubbles, stage_busy_s
from sarathi_lab.engine.metrics import IterationRecord
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.harness.tasks import TaskContext
from sarathi_lab.harness.workloads import build_workload
from sarathi_lab.measure.profiling import link
from sarathi_lab.measure.tasks.profile import _device
from sarathi_lab.plan import build_scheduler
from sarathi_lab.sim.handoff import Handoff
from sarathi_lab.sim.pipeline_run import serve_pipeline
from sarathi_lab.sim.profile_model import ProfileCostModel
from sarathi_lab.sim.profiles import own_profile_path
from sarathi_lab.sim.stage_profile import LOOPBACK, ProfileStages

TAKES_CONTEXT = True
LINK_SIZES_REPORTED = (8, 65536, 1048576)   # bytes: a header, 64 KiB, 1 MiB
HANDOFF_SEED = 1000   # added to the run's seed: the handoff's requests are never the run's own

log = logging.getLogger(__name__)

# When each micro-batch ran on each stage: the executor's own timeline, else an estimate from the
# iterations (exact only for one micro-batch in flight, and marked so).
TIMELINE_COLUMNS = ("stage", "micro_batch", "start_s", "end_s")
# Where recorded: when a stage had the command, when its host work was done, and its tokens.
HOST_COLUMNS = ("command_s", "planned_s", "tokens")


def estimated_timeline(iterations: list[IterationRecord], layers: list[int]) -> pd.DataFrame:
    """The forward runs stage after stage, each its share of the layers."""
    share = np.cumsum([0, *layers]) / sum(layers)
    begins = [it.start + it.schedule_time + it.prepare_time for it in iterations]
    return pd.DataFrame([(s, k, begin + share[s] * it.forward_time,
                          begin + share[s + 1] * it.forward_time)
                         for k, (it, begin) in enumerate(zip(iterations, begins))
                         for s in range(len(layers))],
                        columns=list(TIMELINE_COLUMNS))


def engine_timeline(llm, num_micro_batches: int,
                    first: int | None = None) -> tuple[pd.DataFrame, bool]:
    """(spans from 0, estimated?); ``first``: the first micro-batch's number (None: the last N)."""
    executor = llm.engine.executor
    if hasattr(executor, "stage_timeline"):
        timeline = executor.stage_timeline()
        # A stage's tensor-parallel ranks compute in lock step: its first rank speaks for it.
        kept_columns = [c for c in (*TIMELINE_COLUMNS, *HOST_COLUMNS) if c in timeline.columns]
        timeline = timeline.sort_values("rank").drop_duplicates(["stage", "micro_batch"])
        timeline = timeline[kept_columns]
        numbers = sorted(timeline.micro_batch.unique())
        kept = ([m for m in numbers if first <= m < first + num_micro_batches] if first is not None
                else numbers[-num_micro_batches:] if num_micro_batches else [])
        timeline = timeline[timeline.micro_batch.isin(kept)].copy()
        timeline["micro_batch"] = timeline.micro_batch.map({m: i for i, m in enumerate(kept)})
        return timeline.sort_values(["micro_batch", "stage"]).reset_index(drop=True), False
    from sarathi_lab.model.parallel.stages import Stage

    stages, total = llm.config.pipeline_parallel, llm.model_config.num_hidden_layers
    layers = [Stage.of(total, stages, s).num_layers for s in range(stages)]
    log.warning("the executor records no stage timeline: each stage's spans are estimated from "
                "the iterations (one micro-batch in flight), not measured")
    its = llm.metrics.iterations[-num_micro_batches:] if num_micro_batches else []
    return estimated_timeline(its, layers), True


def spans(timeline: pd.DataFrame, stages: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end): [stages, micro-batches] seconds from a timeline's rows."""
    n = int(timeline.micro_batch.max()) + 1 if len(timeline) else 0
    start, end = np.full((stages, n), np.nan), np.full((stages, n), np.nan)
    at = timeline.stage.to_numpy(int), timeline.micro_batch.to_numpy(int)
    start[at] = timeline.start_s.to_numpy(float)
    end[at] = timeline.end_s.to_numpy(float)
    if np.isnan(start).any():
        raise ValueError("the stage timeline misses a micro-batch on some stage: "
                         "every micro-batch runs on every stage")
    return start, end


def check(cfg, context: int) -> None:
    stages = cfg.engine.pipeline_parallel
    if stages < 2:
        raise ConfigError("engine.pipeline_parallel", stages, "is invalid with "
                          "task=pipeline_bubbles: a pipeline has bubbles between stages",
                          "2 or more", keys=AS_WRITTEN)
    cores, handoff = len(os.sched_getaffinity(0)), cfg.measure.handoff_requests
    if cfg.measure.pin_stages and cfg.engine.tensor_parallel * stages > cores:
        raise ConfigError("measure.pin_stages", Written("true"), "is invalid with "
                          f"engine.pipeline_parallel={stages}: {cores} cores may run this "
                          "process, fewer than one a rank",
                          "measure.pin_stages=false, or fewer stages", keys=AS_WRITTEN)
    if handoff is not None and cfg.workload.kind in ("trace", "trace_lengths"):
        raise ConfigError("measure.handoff_requests", handoff, "is invalid with "
                          f"workload={cfg.workload.kind}: the handoff's requests are drawn from a "
                          "generated workload with another seed", "null", keys=AS_WRITTEN)


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` on ``cores``: threads started later inherit their parent's."""
    for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def pinned_ranks(llm):
    """Each rank on a core of its own, so a stage idles only when the pipeline leaves it idle; the
    driver's cores come back after. Yields the cores by rank."""
    mine = os.sched_getaffinity(0)
    cores = sorted(mine)
    group = getattr(llm.engine.executor, "group", None)
    pids = [os.getpid(), *(p.pid for p in (getattr(group, "processes", None) or []))]
    if len(pids) < llm.config.world_size:
        # Under torchrun the other ranks are not this process's children: nothing to pin.
        log.warning("measure.pin_stages: %d of %d ranks are this process's own; "
                    "the others stay unpinned", len(pids), llm.config.world_size)
    for pid, core in zip(pids, cores):
        _pin(pid, {core})
    try:
        yield cores[:len(pids)]
    finally:
        _pin(os.getpid(), mine)


def _riders(iterations: pd.DataFrame, ids: dict[int, int]) -> list[list[int]]:
    return [[ids[r] for r in (*row.prefill_request_ids, *row.decode_request_ids)]
            for row in iterations.itertuples()]


def _stage0_gap_p50_s(start: np.ndarray, end: np.ndarray) -> float:
    """Stage 0's median gap between forwards: the driver's host work, ``StageTimes.host_s``."""
    return float(np.median(start[0, 1:] - end[0, :-1])) if start.shape[1] > 1 else float("nan")


def _host_p50_s(timeline: pd.DataFrame) -> dict[str, float]:
    if "planned_s" not in timeline.columns:
        return {}
    host = (timeline.planned_s - timeline.command_s).groupby(timeline.stage).median()
    return {f"stage{int(s)}_host_p50_s": float(v) for s, v in host.items()}


def _quantiles(prefix: str, bubbles: np.ndarray) -> dict[str, float]:
    return {f"{prefix}_p50_s": float(np.median(bubbles)),
            f"{prefix}_p90_s": float(np.percentile(bubbles, 90)),
            f"{prefix}_mean_s": float(bubbles.mean())}


def measure_handoff(cfg, llm) -> Handoff | None:
    """Other requests through the pipeline, pinned as now, price the handoff (None: no timeline)."""
    n = cfg.measure.handoff_requests
    work = build_workload(dataclasses.replace(cfg.workload, num_requests=n), cfg.seq_len,
                          cfg.pd_ratio, cfg.seed + HANDOFF_SEED, llm.model_config.vocab_size)
    first = getattr(llm.engine.executor, "micro_batches_submitted", None)
    llm.generate(work.prompts, max_new_tokens=work.decode_lens, arrival_times=work.arrival_times,
                 sampling=SamplingParams(ignore_eos=True))
    timeline, estimated = engine_timeline(llm, len(llm.metrics.iterations), first)
    if estimated:
        log.warning("measure.handoff_requests: the executor records no stage timeline; "
                    "the prediction's messages are priced by the link")
        return None
    return Handoff.from_timeline(
        timeline, f"{n} other requests (seed {cfg.seed + HANDOFF_SEED}) through this pipeline")


def simulate(llm, lengths: list[tuple[int, int]], arrivals: list[float] | None,
             max_in_flight: int | None, cores: list[int], handoff: Handoff | None):
    """The run on the simulated pipeline, priced by this device's profile and a link measured now:
    (result, its cost model, link), or (None, why, None)."""
    cfg = llm.config
    path = own_profile_path(_device(llm)[0], cfg.model)
    if not path.is_file():
        return None, (f"none: no profile of model={cfg.model} on this device ({path}); measure one "
                      f"with python -m sarathi_lab.run task=profile model={cfg.model} (the run's "
                      "dtype and threads)"), None
    whole = ProfileCostModel.from_csv(path, llm.model_config, str(llm.dtype).removeprefix("torch."))
    item = llm.dtype.itemsize
    try:
        measured = link.measure(cores[:2] if len(cores) >= 2 else None)
    except RuntimeError as e:
        log.warning("task=pipeline_bubbles: %s; its prediction assumes %s", e, LOOPBACK.describe())
        measured = LOOPBACK
    mc = llm.model_config
    stages = ProfileStages(whole, cfg.pipeline_parallel, mc.hidden_size * item, link=measured,
                           logits_row_bytes=mc.vocab_size * item, handoff=handoff)
    sim = serve_pipeline(build_scheduler(llm.plan), stages, lengths, arrivals, depth=max_in_flight)
    return sim, stages.describe(), measured


def _prediction(sim, stages: int, requests: int
                ) -> tuple[dict[str, float], np.ndarray, np.ndarray, pd.DataFrame]:
    """NaN and empty without a simulated run, so that the measurement stands alone."""
    if sim is None:
        nan = np.full(requests, np.nan)
        keys = ("sim_bubble_p50_s", "sim_bubble_p90_s", "sim_bubble_mean_s", "sim_makespan_s",
                "sim_num_micro_batches", "sim_stage_idle_share", "sim_stage0_gap_p50_s")
        empty = pd.DataFrame(columns=list(TIMELINE_COLUMNS))
        return dict.fromkeys(keys, float("nan")), nan, nan, empty
    finish = np.array([r.finish for r in sorted(sim.metrics.requests, key=lambda r: r.request_id)])
    stage, micro_batch = np.indices(sim.stage_start_s.shape)
    timeline = pd.DataFrame(dict(zip(TIMELINE_COLUMNS, (
        stage.ravel(), micro_batch.ravel(), sim.stage_start_s.ravel(), sim.stage_end_s.ravel()))))
    summary = _quantiles("sim_bubble", sim.request_bubble_s) | {
        "sim_makespan_s": sim.makespan_s, "sim_num_micro_batches": sim.num_micro_batches,
        "sim_stage_idle_share": float(1 - sum(sim.stage_busy_s) / (stages * sim.makespan_s)),
        "sim_stage0_gap_p50_s": _stage0_gap_p50_s(sim.stage_start_s, sim.stage_end_s)}
    return summary, sim.request_bubble_s, finish, timeline


def run(cfg, llm, context: TaskContext) -> tuple[dict[str, float], dict[str, pd.DataFrame]]:
    workload = context.workload
    with pinned_ranks(llm) if cfg.measure.pin_stages else contextlib.nullcontext([]) as cores:
        handoff = measure_handoff(cfg, llm) if cfg.measure.handoff_requests else None
        # The run's first micro-batch's number on the timeline (the warm-up's came before it).
        first = getattr(llm.engine.executor, "micro_batches_submitted", None)
        llm.generate(workload.prompts, max_new_tokens=workload.decode_lens,
                     arrival_times=workload.arrival_times, sampling=SamplingParams(ignore_eos=True))
    metrics = llm.metrics
    iterations = pd.DataFrame(metrics.iteration_columns())
    requests = pd.DataFrame(metrics.request_rows())
    timeline, estimated = engine_timeline(llm, len(iterations), first)
    start, end = spans(timeline, cfg.engine.pipeline_parallel)
    order = sorted(r.request_id for r in metrics.requests)
    ids = {rid: i for i, rid in enumerate(order)}
    measured_mb = micro_batch_bubbles(start, end)
    measured = request_bubbles(measured_mb, _riders(iterations, ids), len(order))
    origin = min(r.arrival for r in metrics.requests)
    by_id = sorted(metrics.requests, key=lambda r: r.request_id)
    finish = np.array([r.finish for r in by_id]) - origin

    lengths = [(len(p), d) for p, d in zip(workload.prompts, workload.decode_lens)]
    # As many micro-batches in flight as the engine: one where it records no timeline.
    depth = 1 if estimated else getattr(llm.engine.executor, "depth", None)
    sim, described, measured_link = simulate(llm, lengths, workload.arrival_times,
                                             max_in_flight=depth, cores=cores, handoff=handoff)
    if sim is None:
        log.warning("task=pipeline_bubbles: no prediction beside the measurement: %s",
                    described.removeprefix("none: "))
    predicted, sim_bubbles, sim_finish, sim_timeline = _prediction(
        sim, cfg.engine.pipeline_parallel, len(order))

    makespan = float(end.max() - start.min()) if start.size else 0.0
    busy = stage_busy_s(start, end)
    summary = (_quantiles("bubble", measured) | predicted
               | {"makespan_s": makespan, "num_micro_batches": len(iterations),
                  "stage_idle_share": (float(1 - busy.sum() / (len(busy) * makespan))
                                       if makespan else 0.0),
                  "stage0_gap_p50_s": _stage0_gap_p50_s(start, end),
                  "timeline_estimated": float(estimated), "num_pinned_ranks": len(cores),
                  "sim_handoff_micro_batches": handoff.micro_batches if handoff else 0})
    summary |= {f"stage{s}_busy_s": float(b) for s, b in enumerate(busy)}
    summary |= _host_p50_s(timeline) | {
        f"sim_message_{size}b_s": measured_link.message_s(size) if measured_link else float("nan")
        for size in LINK_SIZES_REPORTED}
    table = pd.DataFrame({"request": range(len(order)), "prompt_tokens": [p for p, _ in lengths],
                          "decode_tokens": [d for _, d in lengths], "bubble_s": measured,
                          "sim_bubble_s": sim_bubbles, "finish_s": finish,
                          "sim_finish_s": sim_finish})

    how = "timeline estimated from the iterations" if estimated else "timeline measured"
    log.info("median bubble per request: measured %.4g s, simulated %.4g s (%s); %d micro-batches",
             summary["bubble_p50_s"], summary["sim_bubble_p50_s"], how, len(iterations))
    pinned = ",".join(map(str, cores)) or "none"
    prediction = pd.DataFrame([{"sim_cost_model": described, "pinned_cores": pinned}])
    return summary, {"prediction": prediction, "stage_timeline": timeline,
                     "sim_stage_timeline": sim_timeline, "request_bubbles": table,
                     "iterations": iterations, "requests": requests}

