"""How fast a simulated run is as a whole process: ``python -m sarathi_lab.run executor=sim`` over
sim_speed's trace written as a trace file, its CPU seconds (user + sys of the child process:
imports, Hydra's composition, the plan, the loop and the results), over several runs; with
``--against DIR`` another checkout's runs alternate with this one's, and their results must be the
same."""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.bench.args import bench_parser, positive_int
from sarathi_lab.measure.bench.trace import requests_refused
from sarathi_lab.measure.sim_check.sim_speed import workload

# sim_speed's workload as a run's overrides; the trace file adds the requests.
OVERRIDES = ("executor=sim", "model=llama2-7b", "engine.sim_device=a100", "scheduler=sarathi_serve",
             "chunk=512", "batch_size=64", "engine.num_kv_blocks=7000", "engine.block_size=16",
             "workload=trace", "logger=none")


def write_trace(path: Path, n: int) -> Path:
    """Arrivals at full precision."""
    prompts, decodes, arrivals = workload(n)
    rows = [f"{a!r},{len(p)},{d}" for a, p, d in zip(arrivals, prompts, decodes)]
    path.write_text("\n".join(["arrived_at,num_prefill_tokens,num_decode_tokens", *rows]) + "\n")
    return path


def run_once(checkout: Path, trace: Path, out: Path,
             python: str = sys.executable) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "kernels")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([python, "-m", "sarathi_lab.run", *OVERRIDES, f"workload.path={trace}",
                           f"hydra.run.dir={out}"], cwd=checkout, env=env, capture_output=True,
                          text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: the run of {checkout} failed (exit {done.returncode}): "
                         f"{done.stderr[-2000:]}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Every figure of the summary is simulated: two runs of the same code give the same one.
    return cpu_s, json.loads((out / "metrics.json").read_text())["summary"]


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("sim_process", __doc__)
    parser.add_argument("--requests", type=positive_int, default=4096)
    parser.add_argument("--runs", type=positive_int, default=5, help="runs of each checkout")
    parser.add_argument("--against", type=Path, help="another checkout (e.g. `git worktree add "
                        "/tmp/before COMMIT`), run alternately")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the runs use")
    args = parser.parse_args(argv)
    if refused := requests_refused(args.requests, (1024, 1024), (256, 256)):  # workload()'s
        parser.error(refused)
    checkouts = {"this": REPO_ROOT}
    if args.against is not None:
        if not (args.against / "sarathi_lab" / "run.py").is_file():
            parser.error(f"--against={str(args.against)!r} is invalid: not a checkout of this "
                         f"repository")
        checkouts["against"] = args.against.resolve()
    with tempfile.TemporaryDirectory(prefix="sim_process_") as tmp:
        trace = write_trace(Path(tmp) / "trace.csv", args.requests)
        cpu: dict[str, list[float]] = {name: [] for name in checkouts}
        summaries: dict[str, dict] = {}
        for i in range(args.runs):
            # Alternating which goes first: a machine slowing over the runs weighs on both alike.
            for name in (list(checkouts) if i % 2 == 0 else list(reversed(checkouts))):
                cpu_s, summaries[name] = run_once(checkouts[name], trace, Path(tmp) / f"{name}_{i}",
                                                  args.python)
                cpu[name].append(cpu_s)
                print(f"run {i + 1} {name}: {cpu_s:.2f} s CPU", flush=True)
    for name, times in cpu.items():
        print(f"{name} ({checkouts[name]}): median {statistics.median(times):.2f} s CPU, min "
              f"{min(times):.2f} s, {summaries[name]['num_iterations']} iterations")
    if "against" in cpu:
        ratio = statistics.median(cpu["against"]) / statistics.median(cpu["this"])
        same = summaries["this"] == summaries["against"]
        print(f"against / this: {ratio:.2f}x (medians); "
              f"results {'identical' if same else 'DIFFER'}")
        if not same:
            raise SystemExit(1)
