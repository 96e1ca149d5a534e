"""Run the paper's experiments into a results root, at full (CPU default) or CI scale.

    python -m sarathi_lab.analysis.produce                     # all seven, CPU defaults (~30 min)
    python -m sarathi_lab.analysis.produce --scale ci          # the quick set (about a minute)
    python -m sarathi_lab.analysis.produce pd_ratio --root outputs
    python -m sarathi_lab.analysis.produce -o device.num_threads=1   # extra overrides for every sweep

Each experiment's sweep runs as ``python -m sarathi_lab.run -m experiment=NAME`` would, into
``<root>/<name>/multiruns/<scale>-<time>/``; all of them in this one process, so that the
interpreter's start-up (seconds) is paid once rather than per experiment.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from sarathi_lab.harness import REPO_ROOT

EXPERIMENTS = ("per_token_cost", "tile_quantization", "decode_speedup", "pd_ratio", "chunk_overhead",
               "orca_compare", "scheduler_latency")

# The quick set (seconds per job): the tiny model, short requests, two points per swept axis, one
# thread (the tiny model's iterations are too short to gain from two, and lose much when other
# jobs share the cores). What each experiment measures is unchanged; its numbers are not the paper's.
_CI_COMMON = ["model=tiny", "logger=none", "measure.reps=1", "device.num_threads=1"]
CI_OVERRIDES = {
    "per_token_cost": ["seq_len=64", "batch_size=1,4"],
    "tile_quantization": ["seq_len=80", "measure.token_step=16", "measure.tile=32"],
    "decode_speedup": ["seq_len=64,96", "batch_size=2,4", "chunk=32"],
    "pd_ratio": ["seq_len=96", "pd_ratio=4,16", "chunk=32", "batch_size=3"],
    "chunk_overhead": ["seq_len=64,128", "chunk=32,64", "pd_ratio=8"],
    "orca_compare": ["seq_len=64,96", "chunk=32", "pd_ratio=4", "workload.num_requests=8"],
    "scheduler_latency": ["seq_len=96", "workload.min_tokens=32", "chunk=32", "workload.num_requests=6",
                          "workload.qps=20,80"],
}
SCALES = ("full", "ci")


def sweep_args(name: str, root: str | Path, scale: str, extra: list[str] = ()) -> list[str]:
    """The arguments of ``python -m sarathi_lab.run`` for one experiment's sweep."""
    sweep_dir = Path(root).resolve() / name / "multiruns" / f"{scale}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    overrides = _CI_COMMON + CI_OVERRIDES[name] if scale == "ci" else []
    return ["-m", f"experiment={name}", f"hydra.sweep.dir={sweep_dir}", *overrides, *extra]


def run_experiments(names, root: str | Path, scale: str = "full") -> None:
    """The experiments' sweeps in one fresh process; raises CalledProcessError if any job failed."""
    subprocess.run([sys.executable, "-m", __name__, "--root", str(root), "--scale", scale, *names],
                   check=True, cwd=REPO_ROOT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.analysis.produce",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}")
    parser.add_argument("--root", default=str(REPO_ROOT / "outputs"), help="results root")
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override added to every sweep (repeatable)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(EXPERIMENTS))
    if unknown:
        parser.error(f"unknown experiment {unknown[0]!r}; known: {', '.join(EXPERIMENTS)}")
    from sarathi_lab.run import main as run_main  # the CLI's Hydra entry point, called once per sweep

    failed = []
    for name in args.names or EXPERIMENTS:
        sys.argv = ["sarathi_lab.run", *sweep_args(name, args.root, args.scale, args.override)]
        try:
            run_main()
        except SystemExit as e:  # a sweep with a failed job exits 1 at its end; the others still run
            if e.code:
                failed.append(name)
    if failed:
        raise SystemExit(f"failed jobs in: {', '.join(failed)} (see sweep_summary.json of each)")


if __name__ == "__main__":
    main()
