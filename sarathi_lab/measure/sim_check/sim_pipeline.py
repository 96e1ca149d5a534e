"""Pipeline bubbles of Orca-style hybrid batching against SARATHI's chunked prefills, GPT-3 on TP8 x
PP8 A100s, served by the engine's loop over the simulated pipeline (docs/sim/README.md,
section 2)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab import provenance, sim
from sarathi_lab.analysis.paper_results.pipeline_bubbles import PAPER
from sarathi_lab.config import KV_WATERMARK, REPO_ROOT, EngineConfig
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.measure.bench.args import bench_parser, positive_int
from sarathi_lab.sim.build import kv_capacity_tokens
from sarathi_lab.sim.device import load_device
from sarathi_lab.sim.parallel import StageCostModel
from sarathi_lab.sim.pipeline_run import PipelineRun, serve_pipeline
from sarathi_lab.sim.sharding import Parallelism

# GPT-3's shape in a config-only directory: no weights, which load_config would refuse.
GPT3 = str(Path(sim.__file__).with_name("models") / "gpt3")
FILES = ("pipeline_bubbles.csv", "pipeline_summary.csv", "pipeline_bubbles.png")


def zipf_lengths(n: int, low: int, high: int, theta: float, pd_ratio: float,
                 seed: int) -> list[tuple[int, int]]:
    """Total lengths in [low, high] with P(length of rank k) ~ 1 / k^theta (as the harness's zipf
    workload and vidur draw them), split into prompt and decode at P:D."""
    rng = np.random.default_rng(seed)
    choices = np.arange(low, high + 1)
    weights = 1.0 / np.arange(1, len(choices) + 1) ** theta
    totals = rng.choice(choices, size=n, p=weights / weights.sum())
    decodes = [max(1, round(t / (1 + pd_ratio))) for t in totals.tolist()]
    return [(t - d, d) for t, d in zip(totals.tolist(), decodes)]


def gpu_scheduler(name: str, cost: StageCostModel, max_batch_size: int = 32, chunk_size: int = 256):
    """``name`` over the cache one GPU of a stage holds (its layers' and heads' of every request in
    flight): the shard's capacity is the pipeline's."""
    tokens = kv_capacity_tokens(cost.roofline.device, cost.shard, cost.roofline.elem_bytes,
                                chunk_size + max_batch_size)
    blocks = BlockManager(tokens // EngineConfig.block_size, EngineConfig.block_size, KV_WATERMARK)
    return make_scheduler(name, blocks, max_batch_size=max_batch_size, chunk_size=chunk_size,
                          max_model_len=cost.shard.max_position_embeddings)


def fig12(num_requests: int = 10_000, seed: int = 0,
          progress=print) -> tuple[pd.DataFrame, dict[str, PipelineRun]]:
    """Orca-style hybrid batching against SARATHI on GPT-3, TP8 x PP8 A100s: (summary, runs)."""
    from transformers import AutoConfig

    lengths = zipf_lengths(num_requests, 1024, 4096, 0.4, 10.0, seed)
    cost = StageCostModel(load_device("a100", "float16"), AutoConfig.from_pretrained(GPT3),
                          Parallelism(tp=8, pp=8))
    results, rows = {}, []
    for scheduler in ("orca", "sarathi"):
        started = time.process_time()
        res = serve_pipeline(gpu_scheduler(scheduler, cost), cost, lengths)
        results[scheduler] = res
        busy = sum(res.stage_busy_s) / (len(res.stage_busy_s) * res.makespan_s)
        rows.append({"scheduler": scheduler, "requests": num_requests,
                     "micro_batches": res.num_micro_batches, "makespan_s": res.makespan_s,
                     "median_bubble_s": float(np.median(res.request_bubble_s)),
                     "p90_bubble_s": float(np.percentile(res.request_bubble_s, 90)),
                     "bubble_share": 1 - busy, "sim_cpu_s": time.process_time() - started})
        progress(f"{scheduler}: {rows[-1]}")
    return pd.DataFrame(rows), results


def write(summary: pd.DataFrame, results: dict[str, PipelineRun], out: Path) -> None:
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
    pd.DataFrame(table).to_csv(out / FILES[0], index=False, float_format="%.5g")
    summary.to_csv(out / FILES[1], index=False, float_format="%.5g")
    left.set(xlabel="pipeline bubble time per request (s)", ylabel="CDF",
             title="GPT-3, TP8 x PP8 A100 (sim)")
    right.set(xlabel="time (s)", ylabel="requests completed",
              title=f"{n} requests, P:D 10, chunk 256")
    for ax in (left, right):
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / FILES[2], dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__spec__, __doc__)
    parser.add_argument("--smoke", action="store_true", help="300 requests instead of 10,000")
    parser.add_argument("--out", type=Path, help="default docs/sim (smoke: ./sim_pipeline_smoke)")
    parser.add_argument("--requests", type=positive_int)
    parser.add_argument("--force", action="store_true",
                        help="replace tables of another request count in OUT")
    args = parser.parse_args(argv)
    out = args.out or (Path("sim_pipeline_smoke") if args.smoke else REPO_ROOT / "docs" / "sim")
    requests = args.requests or (300 if args.smoke else 10_000)
    planned = dict.fromkeys((out / name for name in FILES), provenance.Provenance(
        "simulated A100 (pipeline)", f"{requests} requests",
        writer="python -m sarathi_lab.measure.sim_check.sim_pipeline"))
    provenance.check_or_refuse(parser, planned, args.force,
                               "--force replaces them; --out DIR writes elsewhere")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out={out} is invalid: must be a directory that can be created "
                     f"({e.strerror})")
    summary, results = fig12(requests)
    write(summary, results, out)
    provenance.record(planned)
    orca, sarathi = (summary.set_index("scheduler").loc[name] for name in ("orca", "sarathi"))
    print(f"median bubble per request: orca / sarathi = "
          f"{orca.median_bubble_s / sarathi.median_bubble_s:.2f}x (paper "
          f"{PAPER['median_bubble_ratio']}x); time to complete all: "
          f"{orca.makespan_s / sarathi.makespan_s:.2f}x (paper {PAPER['end_to_end_ratio']}x); "
          f"wrote {out}")


if __name__ == "__main__":
    main()
