"""How fast the simulator itself runs: requests through ``LLM(executor="sim")`` on one core, in CPU
seconds, requests/s and iterations/s, and where that time goes (docs/sim/README.md, section 3)."""
from __future__ import annotations

import contextlib
import cProfile
import hashlib
import json
import pstats
import time
from dataclasses import dataclass

from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.measure.bench.args import bench_parser, int_range, positive_float, positive_int
from sarathi_lab.measure.bench.trace import ARRIVAL_RATE_RPS, requests_refused, workload
from sarathi_lab.sim.device import DEVICES


@dataclass(frozen=True)
class Speed:
    num_requests: int
    num_iterations: int
    simulated_s: float
    cpu_s: float
    digest: str = ""

    def per_cpu_s(self, n: int) -> float:
        return n / self.cpu_s if self.cpu_s > 0 else float("inf")


def simulate(n: int, model: str = "llama2-7b", device: str = "a100",
             scheduler: str = "sarathi_serve", chunk: int = 512, batch: int = 64,
             prompt_tokens: tuple[int, int] = (1024, 1024),
             decode_tokens: tuple[int, int] = (256, 256), rate_rps: float = ARRIVAL_RATE_RPS,
             with_digest: bool = False) -> Speed:
    """The engine is built before the clock starts."""
    from sarathi_lab import LLM

    llm = LLM(model, executor="sim", sim_device=device, scheduler=scheduler, chunk_size=chunk,
              max_batch_size=batch)
    prompts, decodes, arrivals = workload(n, prompt_tokens, decode_tokens, rate_rps=rate_rps)
    started = time.process_time()
    llm.generate(prompts, decodes, arrival_times=arrivals)
    cpu_s = time.process_time() - started
    summary = llm.metrics.summary()
    return Speed(int(summary["num_requests"]), int(summary["num_iterations"]),
                 summary["makespan_s"], cpu_s, digest(llm.metrics) if with_digest else "")


def digest(metrics) -> str:
    """What a change to the simulator's speed alone must leave as it was."""
    records = [metrics.iteration_rows(), metrics.request_rows(), metrics.summary()]
    text = json.dumps(records, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("sim_speed", __doc__)
    parser.add_argument("--requests", type=positive_int, default=10_000)
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--device", choices=DEVICES, default="a100")
    parser.add_argument("--scheduler", choices=scheduler_names(), default="sarathi_serve")
    parser.add_argument("--chunk", type=positive_int, default=512,
                        help="chunk size (sarathi) or token budget")
    parser.add_argument("--batch", type=positive_int, default=64, help="max_batch_size")
    parser.add_argument("--prompt-tokens", type=int_range, default=(1024, 1024),
                        help="N, or LO-HI drawn uniformly")
    parser.add_argument("--decode-tokens", type=int_range, default=(256, 256),
                        help="N, or LO-HI drawn uniformly")
    parser.add_argument("--rate", type=positive_float, default=ARRIVAL_RATE_RPS,
                        help="Poisson arrivals, requests/s")
    parser.add_argument("--profile", action="store_true",
                        help="print cProfile's top entries by own time")
    parser.add_argument("--digest", action="store_true",
                        help="print a hash of the run's records (a change to its speed alone keeps "
                             "it)")
    parser.add_argument("--top", type=positive_int, default=15)
    args = parser.parse_args(argv)
    if refused := requests_refused(args.requests, args.prompt_tokens, args.decode_tokens):
        parser.error(refused)
    profiler = cProfile.Profile()
    with profiler if args.profile else contextlib.nullcontext():
        speed = simulate(args.requests, args.model, args.device, args.scheduler, args.chunk,
                         args.batch, args.prompt_tokens, args.decode_tokens, args.rate, args.digest)
    print(f"{speed.num_requests} requests ({speed.num_iterations} iterations, "
          f"{speed.simulated_s:.0f} s simulated) in {speed.cpu_s:.2f} s CPU: "
          f"{speed.per_cpu_s(speed.num_requests):,.0f} requests/s, "
          f"{speed.per_cpu_s(speed.num_iterations):,.0f} iterations/s")
    if args.digest:
        print(f"digest {speed.digest}")
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
