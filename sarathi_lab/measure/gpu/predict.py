"""The simulator's predictions of the suite's serving steps, made before a GPU runs them: every job
of each step (its overlay's overrides, experiment=gpu/NAME, as the GPU sweep expands them) rebuilt
with ``executor=sim`` on each simulated chip under each cost model, one at a time, into
docs/sim/predictions_<device>_<commit>.csv.

    python -m sarathi_lab.measure gpu_predict   # h100 and h200, profile and calibrated
    python -m sarathi_lab.measure gpu_predict --devices h200 --cost-models profile \
        --steps paper.capacity

A row per job and cost model: what the GPU run will measure (median TTFT, P50/P99 TBT, median
scheduling delay; a search's capacity and binding) and ``serving_s``, the seconds of virtual clock
the job spends serving (a search: its trials' makespans summed), the part of the call that
arithmetic on the device's speed alone cannot give. A cost model the device lacks (no
calibration, no profile of the model) is a row saying so, not a stop.
"""
from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.config import REPO_ROOT, ConfigError
from sarathi_lab.harness.results import METRICS, read_record
from sarathi_lab.measure.gpu import engine_code
from sarathi_lab.measure.gpu.plan import Step, select
from sarathi_lab.measure.gpu.steps.paper import job_overrides

DEVICES = ("h100", "h200")
COST_MODELS = ("profile", "calibrated")
STEPS = "paper.scheduler_latency,paper.capacity"
# What the simulated rebuild replaces: the simulator takes no device or weights.
_REPLACED = {"device", "logger", "on_existing"}
SERVED = ("ttft_p50_s", "itl_p50_s", "itl_p99_s", "sched_delay_p50_s", "makespan_s")
SEARCHED = ("capacity_rps", "resolution", "binding", "num_trials", "at_capacity_itl_p99_s",
            "at_capacity_sched_delay_p50_s")
# The keys the steps sweep, naming a row.
KEYS = ("scheduler", "workload.qps", "seed", "slo", "chunk")


def simulated_job(job: list[str], device: str, cost_model: str) -> list[str]:
    kept = [o for o in job if o.split("=", 1)[0] not in _REPLACED]
    return [*kept, "device=cpu", "executor=sim", f"engine.sim_device={device}",
            f"engine.sim_cost_model={cost_model}", "logger=none", "on_existing=overwrite"]


def _keys(job: list[str]) -> dict[str, str]:
    given = dict(o.split("=", 1) for o in job)
    return {k: given.get(k, "") for k in KEYS}


def predict_job(job: list[str], device: str, cost_model: str, work: Path) -> dict:
    """A search's summary holds its capacity and its trials' serving seconds."""
    from sarathi_lab.harness.compose import run_in_process

    row = {"device": device, "cost_model": cost_model, **_keys(job)}
    try:
        run_in_process(simulated_job(job, device, cost_model), work)
    except (ConfigError, ValueError) as e:  # the device has no such cost model
        return row | {"error": str(e).splitlines()[0][:200]}
    summary = read_record(work / METRICS)["summary"]
    trials = work / "trials.parquet"
    if trials.exists():
        made = pd.read_parquet(trials)
        return row | {k: summary.get(k) for k in SEARCHED} | {
            "trials_rps": " ".join(f"{r:.3g}{'' if p else 'x'}"
                                   for r, p in zip(made.rate_rps, made.passed)),
            "serving_s": float(made.makespan_s.sum())}
    return row | {k: summary.get(k) for k in SERVED} | {"serving_s": summary.get("makespan_s")}


def predict(steps: list[Step], devices, cost_models, work: Path) -> pd.DataFrame:
    rows = []
    for device, cost_model, step in itertools.product(devices, cost_models, steps):
        for i, job in enumerate(job_overrides(step)):
            folder = work / device / cost_model / step.name / str(i)
            row = predict_job(job, device, cost_model, folder)
            rows.append({"step": step.name, "job": i, **row})
            print(f"{step.name} {device} {cost_model} {i}: "
                  f"{row.get('error') or row.get('serving_s')}", flush=True)
    return pd.DataFrame(rows)


def step_totals(table: pd.DataFrame) -> pd.DataFrame:
    """Jobs and serving seconds summed per step, device and cost model."""
    return (table.groupby(["step", "device", "cost_model"], sort=False)
            .agg(jobs=("job", "size"), serving_s=("serving_s", "sum")).reset_index())


def outputs(args: argparse.Namespace, devices: list[str]) -> output_files.Outputs:
    """A table per simulated chip, named for the engine's commit, which its provenance holds."""
    at = engine_code.short_commit() or "unknown"
    made = {device: provenance.Provenance(
        f"simulated {device.upper()} ({args.cost_models.replace(',', ', ')})", args.steps,
        commit=at, writer="python -m sarathi_lab.measure gpu_predict") for device in devices}
    return output_files.Outputs(args.out, {f"predictions_{d}_{at}.csv": made[d] for d in devices},
                                given=f"--out={args.out}", force=args.force,
                                how="--force replaces them; --out DIR writes elsewhere")


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.measure gpu_predict",
                             description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--steps", default=STEPS,
                        help="the suite's steps to predict (names or groups)")
    parser.add_argument("--devices", default=",".join(DEVICES),
                        help="simulated chips, comma-separated")
    parser.add_argument("--cost-models", default=",".join(COST_MODELS), help="comma-separated")
    cli_args.shared(parser, out="where the CSVs go", out_default=REPO_ROOT / "docs" / "sim",
                    force="replace tables another run wrote")
    parser.add_argument("--work", type=Path, default=None,
                        help="the simulated runs (default: a temporary folder)")
    args = parser.parse_args(argv)
    devices = list(dict.fromkeys(args.devices.split(",")))
    cost_models = args.cost_models.split(",")
    try:
        steps = select(args.steps)
        out = outputs(args, devices)
        out.check()
    except ValueError as e:
        parser.error(str(e))
    with tempfile.TemporaryDirectory() as tmp:
        table = predict(steps, devices, cost_models, args.work or Path(tmp))
    names = dict(zip(devices, out.names))
    for device, rows in table.groupby("device", sort=False):
        out.add(names[device], rows.to_csv(index=False, float_format="%.4g"))
    try:
        written = out.write()
    except ValueError as e:
        parser.error(str(e))
    for path in written:
        print(f"wrote {path}")
    print(step_totals(table).to_string(index=False, float_format=lambda v: f"{v:.0f}"))
    print("(GPU jobs as each step's overlay, experiment=gpu/NAME, sets them; simulated instead)")
