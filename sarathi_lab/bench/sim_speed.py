"""How fast the simulator itself runs: ``n`` requests through ``LLM(executor="sim")`` on one core,
in CPU seconds, and with ``--profile`` where that time goes (cProfile's top entries).

    python -m sarathi_lab.bench.sim_speed [--requests 10000] [--model llama2-7b] [--device a100]
        [--scheduler sarathi] [--profile]
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import numpy as np

from sarathi_lab import cli_args
from sarathi_lab.bench.args import positive_int
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.sim.device import DEVICES


def workload(n: int, seed: int = 0, qps: float = 4.0) -> tuple[list[list[int]], list[int], list[float]]:
    """Prompts of 128-2048 tokens, 16-256 decodes, Poisson arrivals: a serving load at which the
    simulated A100 keeps up, so that queues and batches stay realistic."""
    rng = np.random.default_rng(seed)
    prompts = [[1] * int(p) for p in rng.integers(128, 2049, size=n)]
    decodes = rng.integers(16, 257, size=n).tolist()
    arrivals = np.cumsum(rng.exponential(1 / qps, size=n)).tolist()
    return prompts, decodes, arrivals


def simulate(n: int, model: str = "llama2-7b", device: str = "a100", scheduler: str = "sarathi",
             chunk: int = 512, batch: int = 64) -> tuple[float, dict]:
    """(CPU seconds of generate, the run's summary)."""
    from sarathi_lab import LLM

    llm = LLM(model, executor="sim", sim_device=device, scheduler=scheduler, chunk_size=chunk, max_batch_size=batch)
    prompts, decodes, arrivals = workload(n)
    started = time.process_time()
    llm.generate(prompts, decodes, arrival_times=arrivals)
    return time.process_time() - started, llm.metrics.summary()


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.bench.sim_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=positive_int, default=10_000)
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--device", choices=DEVICES, default="a100")
    parser.add_argument("--scheduler", choices=scheduler_names(), default="sarathi")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 15 entries by own time")
    parser.add_argument("--top", type=positive_int, default=15)
    args = parser.parse_args(argv)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    seconds, summary = simulate(args.requests, args.model, args.device, args.scheduler)
    if profiler:
        profiler.disable()
    print(f"{args.requests} requests ({summary['num_iterations']} iterations, {summary['makespan_s']:.0f} s simulated) "
          f"in {seconds:.1f} s CPU")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
