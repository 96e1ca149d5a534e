"""Pipeline-parallel serving on virtual clocks, one per stage, driven by the engine's own scheduler
(SARATHI's Fig. 12: pipeline bubbles of hybrid batching against chunked prefills). The model of the
pipeline, its bubble time and its limits: docs/sim/README.md, section 2.

    python -m sarathi_lab.sim.pipeline [--smoke] [--out DIR]
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from sarathi_lab import cli_args, provenance
from sarathi_lab.config import KV_WATERMARK, REPO_ROOT, EngineConfig
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.bubbles import micro_batch_bubbles, request_bubbles
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import Executor, StepOutput
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import Scheduler, make_scheduler
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.sim.build import kv_capacity_tokens
from sarathi_lab.sim.device import load_device
from sarathi_lab.sim.executor import composition
from sarathi_lab.sim.parallel import StageCostModel, through_stages
from sarathi_lab.sim.sharding import Parallelism

# GPT-3's shape in a config-only directory: no weights, which load_config would refuse.
GPT3 = str(Path(__file__).with_name("models") / "gpt3")
BLOCK_SIZE = EngineConfig.block_size


class _Stages(Executor):
    """The engine's executor seam, unused: the pipeline's stages run its micro-batches."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        raise NotImplementedError("the pipeline's stages run micro-batches, on their own clocks")


class MicroBatch(NamedTuple):
    batch: ScheduledBatch
    start: float   # on stage 0
    exit: float    # its logits back at the driver from the last stage


@dataclass
class PipelineResult:
    metrics: Metrics
    request_bubble_s: np.ndarray        # per request, in request order
    micro_batches: pd.DataFrame         # one row per micro-batch
    stage_busy_s: list[float] = field(default_factory=list)
    # [stages, micro-batches]: when each micro-batch ran on each stage (the bubbles' timeline).
    stage_start_s: np.ndarray | None = None
    stage_end_s: np.ndarray | None = None

    @property
    def makespan_s(self) -> float:
        return self.metrics.summary()["makespan_s"]


class PipelineSimulator:
    """``scheduler``: a name, built here over a cache of ``num_kv_blocks`` (default: what a GPU of the
    roofline's device holds), or a scheduler already built (a real engine's twin: its knobs and cache)."""

    def __init__(self, scheduler: str | Scheduler, cost: StageCostModel, par: Parallelism | None = None,
                 max_batch_size: int = 32, chunk_size: int = 256, num_kv_blocks: int | None = None,
                 max_model_len: int | None = None, max_in_flight: int | None = None):
        self.par, self.cost = par or Parallelism(tp=8, pp=8), cost
        # Micro-batches in the pipeline at once: one a stage (default), or fewer for an engine that keeps fewer.
        self.max_in_flight = max_in_flight or self.par.pp
        if isinstance(scheduler, Scheduler):
            self.scheduler = scheduler
            return
        if max_model_len is None:
            max_model_len = cost.shard.max_position_embeddings
        if num_kv_blocks is None:
            # Every GPU holds its layers' and heads' cache of every request in flight: the shard's
            # capacity is the pipeline's.
            num_kv_blocks = kv_capacity_tokens(self.cost.roofline.device, self.cost.shard,
                                               self.cost.roofline.elem_bytes, chunk_size + max_batch_size) // BLOCK_SIZE
        self.scheduler = make_scheduler(scheduler, BlockManager(num_kv_blocks, BLOCK_SIZE, KV_WATERMARK),
                                        max_batch_size=max_batch_size, chunk_size=chunk_size,
                                        max_model_len=max_model_len)

    def run(self, lengths: list[tuple[int, int]], arrivals: list[float] | None = None) -> PipelineResult:
        """Serve requests of (prompt, decode) tokens arriving at ``arrivals`` (default: all at 0)."""
        stages = self.par.pp
        arrivals = [0.0] * len(lengths) if arrivals is None else list(arrivals)
        seqs = [Sequence(i, [1] * p, d, a) for i, ((p, d), a) in enumerate(zip(lengths, arrivals))]
        pending = deque(sorted(seqs, key=lambda s: s.priority))
        metrics = Metrics(num_submitted=len(seqs))
        sched = self.scheduler
        # The engine's own step bookkeeping (update, request and iteration records) on the pipeline's
        # times; the stages, not an executor, run its micro-batches.
        engine = LLMEngine(sched, _Stages(), VirtualClock())
        engine.start(metrics, SamplingParams())
        stage_free, busy = [0.0] * stages, [0.0] * stages
        in_flight: deque[MicroBatch] = deque()
        rows, spans = [], []
        now, idle_since = 0.0, 0.0   # when stage 0 is next free; since when it has waited with work
        while pending or sched.has_work():
            while pending and pending[0].arrival <= now:
                engine.add_request(pending.popleft())
            while in_flight and in_flight[0].exit <= now:
                mb = in_flight.popleft()
                sched.in_flight.difference_update(c.seq.seq_id for c in mb.batch.chunks)
                engine.finish(mb.batch, StepOutput([0] * len(mb.batch.sampled), 0.0, mb.exit - mb.start, 0.0),
                              mb.start, 0.0, mb.exit)
            batch = sched.schedule() if len(in_flight) < self.max_in_flight else ScheduledBatch()
            if not batch:
                if not (in_flight or pending or sched.has_work()):
                    break   # the last micro-batches just left
                nexts = ([in_flight[0].exit] if in_flight else []) + ([pending[0].arrival] if pending else [])
                if not nexts:
                    raise RuntimeError("the scheduler made an empty batch with requests left and none in flight")
                if not in_flight and not sched.has_work():
                    idle_since = nexts[0]   # an empty system: waiting for an arrival is no bubble
                now = max(now, min(nexts))
                continue
            times = self.cost.times(*composition(batch), len(batch.sampled))
            begins, ends = through_stages(times, now, stage_free, busy)
            mb = MicroBatch(batch, begins[0], ends[-1] + times.return_s)
            in_flight.append(mb)
            ids = [chunk.seq.seq_id for chunk in batch.chunks]
            sched.in_flight.update(ids)
            spans.append((begins, ends, idle_since, ids))
            rows.append((begins[0], mb.exit, batch.num_prefill_tokens, batch.num_decode_tokens, times.stage_s))
            now = idle_since = stage_free[0]
        frame = pd.DataFrame(rows, columns=["start", "exit", "prefill_tokens", "decode_tokens", "stage_s"])
        start = np.array([b for b, _, _, _ in spans]).T.reshape(stages, len(spans))
        end = np.array([e for _, e, _, _ in spans]).T.reshape(stages, len(spans))
        frame["bubble_s"] = micro_batch_bubbles(start, end, [w for _, _, w, _ in spans])
        bubbles = request_bubbles(frame.bubble_s.to_numpy(), [ids for *_, ids in spans], len(seqs))
        return PipelineResult(metrics, bubbles, frame, busy, start, end)


def zipf_lengths(n: int, low: int, high: int, theta: float, pd_ratio: float, seed: int) -> list[tuple[int, int]]:
    """Total lengths in [low, high] with P(length of rank k) ~ 1 / k^theta (rank 1 the shortest,
    as the harness's zipf workload and vidur draw them), split into prompt and decode at P:D."""
    rng = np.random.default_rng(seed)
    choices = np.arange(low, high + 1)
    weights = 1.0 / np.arange(1, len(choices) + 1) ** theta
    totals = rng.choice(choices, size=n, p=weights / weights.sum())
    decodes = [max(1, round(t / (1 + pd_ratio))) for t in totals.tolist()]
    return [(t - d, d) for t, d in zip(totals.tolist(), decodes)]


PAPER = {"median_bubble_ratio": 6.29, "end_to_end_ratio": 1.91}


def fig12(num_requests: int = 10_000, seed: int = 0, progress=print) -> tuple[pd.DataFrame, dict[str, PipelineResult]]:
    """Orca-style hybrid batching against SARATHI on GPT-3, TP8 x PP8 A100s: (summary, results)."""
    lengths = zipf_lengths(num_requests, 1024, 4096, 0.4, 10.0, seed)
    from transformers import AutoConfig  # GPT-3's config directory; a run of the engine's presets needs none

    cost = StageCostModel(load_device("a100", "float16"), AutoConfig.from_pretrained(GPT3), Parallelism(tp=8, pp=8))
    results, rows = {}, []
    for scheduler in ("orca", "sarathi"):
        started = time.process_time()
        res = PipelineSimulator(scheduler, max_batch_size=32, chunk_size=256, cost=cost).run(lengths)
        results[scheduler] = res
        rows.append({"scheduler": scheduler, "requests": num_requests, "micro_batches": len(res.micro_batches),
                     "makespan_s": res.makespan_s, "median_bubble_s": float(np.median(res.request_bubble_s)),
                     "p90_bubble_s": float(np.percentile(res.request_bubble_s, 90)),
                     "bubble_share": 1 - sum(res.stage_busy_s) / (len(res.stage_busy_s) * res.makespan_s),
                     "sim_cpu_s": time.process_time() - started})
        progress(f"{scheduler}: {rows[-1]}")
    return pd.DataFrame(rows), results


def _write(summary: pd.DataFrame, results: dict[str, PipelineResult], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = int(summary.requests.iloc[0])
    marks = sorted({max(1, round(n * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)})
    quantiles = np.linspace(0, 1, 21)
    table = []
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, res in results.items():
        # Seconds from the first arrival until m requests have finished, at each mark.
        done = np.sort([r.finish for r in res.metrics.requests])
        first = min(r.arrival for r in res.metrics.requests)
        table += [{"scheduler": name, "kind": "bubble_quantile", "x": q, "value": float(v)}
                  for q, v in zip(quantiles, np.quantile(res.request_bubble_s, quantiles))]
        table += [{"scheduler": name, "kind": "time_to_complete_s", "x": m,
                   "value": float(done[m - 1] - first)} for m in marks]
        b = np.sort(res.request_bubble_s)
        left.plot(b, np.arange(1, len(b) + 1) / len(b), label=name)
        right.plot(done, np.arange(1, len(done) + 1), label=name)
    pd.DataFrame(table).to_csv(out / "pipeline_bubbles.csv", index=False, float_format="%.5g")
    summary.to_csv(out / "pipeline_summary.csv", index=False, float_format="%.5g")
    left.set(xlabel="pipeline bubble time per request (s)", ylabel="CDF", title="GPT-3, TP8 x PP8 A100 (sim)")
    right.set(xlabel="time (s)", ylabel="requests completed", title=f"{n} requests, P:D 10, chunk 256")
    for ax in (left, right):
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pipeline_bubbles.png", dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.sim.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="300 requests instead of 10,000")
    parser.add_argument("--out", type=Path, default=None, help="default docs/sim (smoke: ./sim_pipeline_smoke)")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--force", action="store_true", help="replace tables of another request count in OUT")
    args = parser.parse_args(argv)
    if args.requests is not None and args.requests < 1:
        parser.error(f"--requests={args.requests} is invalid: must be an integer >= 1")
    out = args.out or (Path("sim_pipeline_smoke") if args.smoke else REPO_ROOT / "docs" / "sim")
    requests = args.requests or (300 if args.smoke else 10_000)
    planned = dict.fromkeys((out / name for name in ("pipeline_bubbles.csv", "pipeline_summary.csv",
                                                     "pipeline_bubbles.png")),
                            provenance.Provenance("simulated A100 (pipeline)", f"{requests} requests",
                                                  writer="python -m sarathi_lab.sim.pipeline"))
    provenance.check_or_refuse(parser, planned, args.force, "--force replaces them; --out DIR writes elsewhere")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out={out} is invalid: must be a directory that can be created ({e.strerror})")
    summary, results = fig12(requests)
    _write(summary, results, out)
    provenance.record(planned)
    orca, sarathi = (summary.set_index("scheduler").loc[name] for name in ("orca", "sarathi"))
    print(f"median bubble per request: orca / sarathi = {orca.median_bubble_s / sarathi.median_bubble_s:.2f}x "
          f"(paper {PAPER['median_bubble_ratio']}x); time to complete all: "
          f"{orca.makespan_s / sarathi.makespan_s:.2f}x (paper {PAPER['end_to_end_ratio']}x); wrote {out}")


if __name__ == "__main__":
    main()
