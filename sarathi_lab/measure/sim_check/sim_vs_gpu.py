"""The simulator against the real engine's own runs on a GPU: every measured run under a results
root rebuilt with ``executor=sim`` under each cost model, every iteration (a task's quantity) it
timed compared with the cost model's, per run kind, cost model and iteration kind
(docs/sim/README.md, sections 9 and 9c). ``--smoke``: the same path on tiny CPU runs."""
from __future__ import annotations

import argparse
import io
import math
import os
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from omegaconf import DictConfig

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import claims, derive, registry
from sarathi_lab.analysis.paper_results import pd_ratio
from sarathi_lab.analysis.runs import Results
from sarathi_lab.config import PREDICTING_COST_MODELS, REPO_ROOT, ConfigError
from sarathi_lab.engine.metrics import iteration_kinds, stalled
from sarathi_lab.executors import recorded_as
from sarathi_lab.harness import scales
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.environment import engine_kind
from sarathi_lab.harness.results import METRICS, natural_order, read_record
from sarathi_lab.measure.bench.args import bench_parser, names_of
from sarathi_lab.measure.bench.task_tables import TABLES, paired
from sarathi_lab.measure.profiling import cpu_ceilings
from sarathi_lab.measure.sim_check import rebuild
from sarathi_lab.measure.sim_check import sim_vs_gpu_report as report
from sarathi_lab.measure.sim_check.point_table import (
    COST_MODEL,
    MEASURED,
    PREDICTED,
    SOURCE,
    rel_err,
    summary,
)
from sarathi_lab.measure.sim_check.sim_validate import (
    DOCS,
    SERVED,
    SMOKE_PROFILE,
    Run,
    batch_errors,
    profile,
    served_errors,
    verdict,
)
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.profiles import profile_path

SERVE = "serve"
LATENCIES = (*SERVED[:3], "tpot_p50_s", "tpot_p99_s", *SERVED[3:])
_KEYS = ("scheduler", "chunk", "batch_size", "seq_len", "pd_ratio", "model", "dtype")
# measure/gpu/collect.py's
LEASE = re.compile(r"\d{4}-\d{2}-\d{2}_[0-9a-f]{7,40}(\+[0-9a-f]{7,40})*")
VS_GPU = DOCS / "vs_gpu"


def finished_runs(root: Path) -> tuple[list[Path], Counter]:
    """The finished measured runs with a comparison; the others counted by why."""
    found, left_out = [], Counter()
    for metrics in sorted(root.glob(f"*/multiruns/*/*/{METRICS}"), key=natural_order):
        record = read_record(metrics)
        task, executor = record["config"].get("task"), record["environment"].get("executor")
        if record.get("partial"):
            left_out["partial (interrupted)"] += 1
        elif not recorded_as(executor, "runs_model"):
            left_out[f"executor={executor}"] += 1
        elif task != SERVE and task not in TABLES:
            left_out[f"{metrics.relative_to(root).parts[0]} (task={task}, no comparison)"] += 1
        else:
            found.append(metrics.parent)
    return found, left_out


def measured_engine(runs: list[Path]) -> str:
    return engine_kind([read_record(run / METRICS)["environment"] for run in runs]) or "no run"


def simulate(run_dir: Path, config: DictConfig, runs: Path, work: Path, device: str,
             cost_model: str) -> Path:
    """The run's ``rebuild.recorded_config`` simulated as under ``runs`` but under
    ``work/<cost_model>/``: ``Results`` reads both."""
    dest = work / cost_model / run_dir.relative_to(runs)
    rebuild.rebuild(run_dir, config, dest, device, cost_model)
    return dest


def refusals(runs: list[Path], device: str, cost_models) -> dict[tuple, str]:
    """(model, dtype, cost model) -> the cost model's ConfigError on ``device``, if any."""
    found = {}
    for model, dtype in dict.fromkeys((c.get("model"), c.get("dtype"))
                                      for c in (read_record(r / METRICS)["config"] for r in runs)):
        if device == "cpu":
            cpu_ceilings.ensure(dtype or "bfloat16")
        for cost_model in cost_models:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    CostModel.for_device(device, model, cost_model, dtype)
            except ConfigError as e:
                found[model, dtype, cost_model] = str(e)
    return found


def stalls(iterations: pd.DataFrame) -> pd.Series:
    """Pauses of the real engine: no cost model predicts them, and a makespan carries them whole."""
    kinds = iteration_kinds(iterations.num_prefill_tokens, iterations.num_decode_tokens)
    return pd.Series(stalled(iterations.duration_s, kinds), index=iterations.index)


def _errors(points: pd.DataFrame) -> dict:
    kept = points[~points.stall] if len(points) else pd.DataFrame(columns=[PREDICTED, MEASURED])
    err = summary(rel_err(kept[PREDICTED], kept[MEASURED]))
    return {f"iter_{stat}": err[stat]
            for stat in ("median_abs_rel_err", "worst_abs_rel_err", "median_rel_err")}


def _serving(run_dir: Path, sim_dir: Path) -> tuple[dict, pd.DataFrame]:
    real, sim = (Run(pd.read_parquet(d / "iterations.parquet"),
                     read_record(d / METRICS)["summary"], math.nan) for d in (run_dir, sim_dir))
    stall = stalls(real.iterations)
    row = batch_errors(real, sim)
    row |= {"real_stall_iterations": int(stall.sum()),
            "real_stall_s": float(real.iterations.duration_s[stall].sum())}
    row |= served_errors(real, sim, LATENCIES) | {f"{k}_sim": sim.summary[k] for k in LATENCIES}
    if not row["identical_batches"]:
        return row, pd.DataFrame()
    it = real.iterations
    return row, pd.DataFrame({"kind": iteration_kinds(it.num_prefill_tokens, it.num_decode_tokens),
                              "label": [f"iteration {i}" for i in range(len(it))],
                              "num_tokens": it.num_tokens, MEASURED: it.duration_s,
                              PREDICTED: sim.iterations.duration_s.to_numpy(),
                              "stall": stall.to_numpy()})


def _measured(run_dir: Path, sim_dir: Path, task: str) -> tuple[dict, pd.DataFrame]:
    name = TABLES[task].name
    real, sim = (pd.read_parquet(d / f"{name}.parquet") for d in (run_dir, sim_dir))
    points, same = paired(task, real, sim)
    counts = {"iterations_real": len(TABLES[task].points(real)),
              "iterations_sim": len(TABLES[task].points(sim))}
    points = points.rename(columns={"simulated_s": PREDICTED})
    return counts | {"identical_batches": same}, points.assign(stall=False)


class Comparison(NamedTuple):
    table: pd.DataFrame
    # every compared iteration (or task quantity): point_table's points
    points: pd.DataFrame
    unavailable: pd.DataFrame


def compare(runs: Path, work: Path, device: str, cost_models=PREDICTING_COST_MODELS,
            progress=print) -> Comparison:
    """Every comparable run under ``runs`` rebuilt under each cost model that runs on ``device``,
    from the config it recorded (a run that cannot be is refused before any is simulated)."""
    rows, points, missing = [], [], Counter()
    compared = finished_runs(runs)[0]
    configs = {run_dir: rebuild.recorded_config(run_dir) for run_dir in compared}
    refused = refusals(compared, device, cost_models)
    for run_dir in compared:
        record, kind = read_record(run_dir / METRICS), run_dir.relative_to(runs).parts[0]
        config, env = record["config"], record["environment"]
        ident = {"run_kind": kind, "task": config.get("task"), "job": run_dir.name,
                 **{k: config.get(k) for k in _KEYS}, "measured_on": env.get("device_name"),
                 "measured_timing_unreliable": bool(env.get("timing_unreliable"))}
        for model in cost_models:
            if why := refused.get((config.get("model"), config.get("dtype"), model)):
                missing[kind, model, why] += 1
                continue
            sim_dir = simulate(run_dir, configs[run_dir], runs, work, device, model)
            serve = ident["task"] == SERVE
            row, its = (_serving(run_dir, sim_dir) if serve
                        else _measured(run_dir, sim_dir, ident["task"]))
            row = ident | {"cost_model": model, "points": len(its)} | row | _errors(its)
            rows.append(row)
            if len(its):
                source = f"this engine measured on {ident['measured_on']}"
                points.append(its.assign(**{SOURCE: source, COST_MODEL: model}, run_kind=kind,
                                         task=ident["task"], job=run_dir.name))
            said = (verdict(row) if serve else f"rows identical {row['identical_batches']}, "
                    f"iteration error {row['iter_median_abs_rel_err']:.1%}")
            progress(f"{kind}/{run_dir.name.split('_')[0]} {ident['task']}, {model}: {said} "
                     f"(worst {row['iter_worst_abs_rel_err']:.1%})")
    for (kind, model, why), n in missing.items():
        progress(f"{kind}: {model} not compared ({n} run(s)): {why}")
    cols = ["run_kind", "cost_model", "runs", "status"]
    unavailable = pd.DataFrame([dict(zip(cols, (k, m, n, f"unavailable: {why}")))
                                for (k, m, why), n in missing.items()], columns=cols)
    every = pd.concat(points, ignore_index=True) if points else pd.DataFrame()
    return Comparison(pd.DataFrame(rows), every, unavailable)


def gains(runs: Path, work: Path,
          cost_models=PREDICTING_COST_MODELS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """pd_ratio's gain per point, measured beside each cost model's, and their claims rows (runs
    flagged timing-unreliable kept: the simulation rebuilt every run)."""
    keys = [*derive.WORKLOAD_KEYS, "chunk"]
    measured = Results(runs, include_unreliable=True)
    def gain(results, name):
        found = pd_ratio.pd_gains(results.summary("pd_ratio"))
        return found[[*keys, "gain"]].rename(columns={"gain": name})
    table = gain(measured, "measured")
    simulated = [Results(work / m) for m in cost_models]
    for model, results in zip(cost_models, simulated):
        table = table.merge(gain(results, model), on=keys, how="left")
    return table, claims.claims_table(measured, simulated, only=["pd_ratio"])


def _smoke_runs(root: Path) -> None:
    """Each result's own smoke runs (``PaperResult.smoke_runs``) at the dry scale."""
    for result in registry.RESULTS:
        for i, overrides in enumerate(result.smoke_runs):
            job = f"{i}_{','.join(overrides) or 'tiny'}"
            run_in_process([f"experiment={result.name}", *scales.overrides(result.name, "dry"),
                            *overrides], root / result.name / "multiruns" / "smoke" / job)


OUTPUTS = ("runs.csv", "iteration_errors.csv", "serving_errors.csv", "gains.csv", "claims.csv",
           "errors.png")


def comparison_provenance(runs: list[Path], device: str, cost_models=PREDICTING_COST_MODELS,
                          lease: str = "") -> provenance.Provenance:
    """Where no run recorded its commit, the lease's: a lease ran at the commit it names."""
    envs = [read_record(run / METRICS)["environment"] for run in runs]
    commit = provenance.commits(e.get("git_commit") for e in envs)
    if commit == provenance.UNRECORDED and lease:
        commit = lease.partition("_")[2]
    machine = "+".join(sorted({str(e.get("device_name")) for e in envs}))
    return provenance.Provenance(f"simulated {device} ({'+'.join(cost_models)}) against measured "
                                 f"runs ({engine_kind(envs)})", machine=machine, lease=lease,
                                 commit=commit,
                                 writer="python -m sarathi_lab.measure sim_vs_gpu")


def _shown(path: Path) -> str:
    path = Path(path).absolute()
    return str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)


def _title(table: pd.DataFrame, compared: list[Path], device: str, cost_models,
           tables: list[str]) -> str:
    first, engine = table.iloc[0], measured_engine(compared)
    title = (f"Simulator ({', '.join(cost_models)}; sim_device={device}) against this engine "
             f"measured on {first['measured_on']}: {first['model']}, {first['dtype']}, {engine}")
    if tables:
        title += f"\nprofile reads {', '.join(tables)}"
    if device != "cpu":
        title += f"\nmeasured side: this engine ({engine}), not the hardware's limit"
    return title


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    cost_models = list(dict.fromkeys(args.cost_model))
    device, runs, out, work = _places(parser, args)

    def outputs(prov: provenance.Provenance) -> output_files.Outputs:
        # A smoke run's folder is its own: what it compares is known once its runs ran.
        return output_files.Outputs(out, dict.fromkeys(OUTPUTS, prov), given=f"--out={out}",
                                    force=args.force or args.smoke,
                                    how="--force replaces them; --out DIR writes elsewhere")
    try:
        outputs(comparison_provenance([] if args.smoke else finished_runs(runs)[0], device,
                                      cost_models, args.lease or "")).check()
    except output_files.OutputRefused as e:
        parser.error(str(e))
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        os.environ.setdefault("SARATHI_PROFILES_DIR", str(out / "profiles"))
        profile("tiny", **SMOKE_PROFILE)
        _smoke_runs(runs)
    compared, left_out = finished_runs(runs)
    total = len(compared) + sum(left_out.values())
    why = ", ".join(f"{n} {why}" for why, n in left_out.items())
    print(f"comparing {len(compared)} of {total} finished runs under {runs}"
          + (f"; left out: {why}" if left_out else ""), flush=True)
    refused = refusals(compared, device, cost_models)
    tables = sorted({_shown(profile_path(device, c.get("model"))) for c in
                     (read_record(r / METRICS)["config"] for r in compared)
                     if "profile" in cost_models
                     and (c.get("model"), c.get("dtype"), "profile") not in refused})
    for table_path in tables:
        print(f"the profile cost model reads {table_path}", flush=True)
    try:
        result = compare(runs, work, device, cost_models, progress=lambda m: print(m, flush=True))
    except ConfigError as e:
        parser.error(str(e))
    try:
        written, ran, errors = _write(
            result, runs, outputs(comparison_provenance(compared, device, cost_models,
                                                        args.lease or "")), work, cost_models,
            lambda ran: _title(result.table, compared, device, ran, tables))
    except output_files.OutputRefused as e:
        parser.error(str(e))
    print(f"wrote {', '.join(p.name for p in written)} into {out} "
          f"({len(compared)} runs x {len(ran)} cost models)")
    shown = errors[errors.status == "compared"]
    if len(shown):
        print(shown[["run_kind", "cost_model", "kind", "points", "median_rel_err",
                     "median_abs_rel_err", "worst_abs_rel_err"]].to_string(
                         index=False, float_format=lambda v: f"{v:.3f}"))


def _parser() -> argparse.ArgumentParser:
    parser = bench_parser("sim_vs_gpu", __doc__)
    parser.add_argument("--runs", type=Path, help="the measured runs' results root (required "
                        "unless --smoke): <experiment>/multiruns/<sweep>/<job>/")
    parser.add_argument("--lease", help="the GPU lease the runs come from, <date>_<commit> as "
                        "docs/gpu/<device>/<lease>/ names it: names the output folder and is "
                        "recorded")
    cli_args.shared(parser, smoke="measure tiny runs and a profile on this CPU first and compare "
                                  "against them (device cpu)",
                    out="where the tables and figure go (default "
                        "docs/sim/vs_gpu/<device>_<lease>; with --smoke sim_vs_gpu_smoke)",
                    force="replace a comparison of other runs (another machine, lease or commit) "
                          "in OUT")
    parser.add_argument("--work", type=Path, help="where the simulated runs and every compared "
                        "iteration (points.csv) go (default outputs/sim_vs_gpu; with --smoke "
                        "OUT/work)")
    parser.add_argument("--device", default="h200",
                        help="the simulated device: the one the runs were measured on")
    parser.add_argument("--cost-model", type=names_of(PREDICTING_COST_MODELS),
                        default=list(PREDICTING_COST_MODELS), help="the cost models to compare, "
                        "comma-separated; one the device cannot run is reported")
    return parser


def _places(parser: argparse.ArgumentParser,
            args: argparse.Namespace) -> tuple[str, Path, Path, Path]:
    if args.lease is not None and not LEASE.fullmatch(args.lease):
        parser.error(f"--lease {args.lease!r} is invalid: must be <date>_<commit> as "
                     f"docs/gpu/<device>/ names a lease (e.g. 2026-11-27_9e2ae41)")
    device, runs = ("cpu", None) if args.smoke else (args.device, args.runs)
    if args.smoke:
        out = args.out or Path("sim_vs_gpu_smoke")
        runs = out / "measured"
    elif runs is None:
        parser.error("--runs is required (the measured runs' results root), unless --smoke")
    elif not finished_runs(runs)[0]:
        parser.error(f"--runs {runs} is invalid: it holds no finished measured run with a "
                     f"comparison (<experiment>/multiruns/<sweep>/<job>/metrics.json with task "
                     f"serve or {', '.join(TABLES)})")
    elif args.out is None and args.lease is None:
        parser.error("--lease is required unless --out: "
                     "the outputs go to docs/sim/vs_gpu/<device>_<lease>/")
    else:
        out = args.out or VS_GPU / f"{device}_{args.lease}"
    work = args.work or (out / "work" if args.smoke else Path("outputs") / "sim_vs_gpu")
    return device, runs, out, work


def _write(result: Comparison, runs: Path, out: output_files.Outputs, work: Path,
           cost_models: list[str], title) -> tuple[list[Path], list[str], pd.DataFrame]:
    """``title(ran)``: the figure's title. The tables and figure are written at once (the work
    folder's points as they are made: they are the runs' own)."""
    table, points = result.table, result.points
    errors = report.iteration_errors(points, result.unavailable)
    tables = {"runs.csv": table, "iteration_errors.csv": errors,
              "serving_errors.csv": report.serving_errors(table)}
    for name, frame in tables.items():
        out.add(name, frame.to_csv(index=False, float_format="%.4g"))
    gain = None
    ran = [m for m in cost_models if len(table) and m in set(table.cost_model)]
    if (runs / "pd_ratio").is_dir() and ran:
        gain, claim_rows = gains(runs, work, ran)
        out.add("gains.csv", gain.to_csv(index=False, float_format="%.4g"))
        out.add("claims.csv", claim_rows.to_csv(index=False))
    if len(points):
        work.mkdir(parents=True, exist_ok=True)
        points.to_csv(work / "points.csv", index=False, float_format="%.5g")
        figure = io.BytesIO()
        report.figure(points, errors, table, gain, title(ran), figure)
        out.add("errors.png", figure.getvalue())
    return out.write(), ran, errors
