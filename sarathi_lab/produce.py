"""Run the paper's experiments into a results root, at full (CPU default) or CI scale.

    python -m sarathi_lab.produce                     # all seven, CPU defaults (~30 min)
    python -m sarathi_lab.produce --scale ci          # the quick set (about a minute)
    python -m sarathi_lab.produce pd_ratio --root outputs
    python -m sarathi_lab.produce -o device.num_threads=1   # extra overrides for every sweep

Each experiment's sweep is ``python -m sarathi_lab.run -m experiment=NAME``, run as a user runs it,
into ``<root>/<name>/multiruns/<scale>-<time>/``. A sweep with a failed job does not stop the
others; the command fails at the end naming them.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import sarathi_lab
from sarathi_lab.analysis.runs import EXPERIMENTS, Results
from sarathi_lab.harness import REPO_ROOT

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


def run_experiments(names, root: str | Path, scale: str = "full", extra: list[str] = ()) -> list[str]:
    """Each experiment's sweep, one ``python -m sarathi_lab.run`` each; returns the names of those
    with a failed job."""
    # The runs import the same sarathi_lab as this process, wherever it was imported from.
    package_root = str(Path(sarathi_lab.__file__).resolve().parents[1])
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    failed = []
    for name in names:
        done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *sweep_args(name, root, scale, extra)],
                              env=env, check=False)
        if done.returncode:
            failed.append(name)
    return failed


def produce_missing(results: Results, scale: str = "ci") -> Results:
    """Runs every experiment that has no finished run under ``results.root``, at ``scale``."""
    missing = results.missing()
    if missing:
        print(f"no finished run under {results.root} of {', '.join(missing)}: running them at scale {scale}",
              flush=True)
        failed = run_experiments(missing, results.root, scale)
        if failed:
            raise RuntimeError(f"failed jobs in: {', '.join(failed)} (see sweep_summary.json of each)")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.produce", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}")
    parser.add_argument("--root", default=str(REPO_ROOT / "outputs"), help="results root")
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override added to every sweep (repeatable)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(EXPERIMENTS))
    if unknown:
        parser.error(f"unknown experiment {unknown[0]!r}; known: {', '.join(EXPERIMENTS)}")
    failed = run_experiments(args.names or EXPERIMENTS, args.root, args.scale, args.override)
    if failed:
        raise SystemExit(f"failed jobs in: {', '.join(failed)} (see sweep_summary.json of each)")


if __name__ == "__main__":
    main()
