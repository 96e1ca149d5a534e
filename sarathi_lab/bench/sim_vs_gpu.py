"""The simulator against the real engine's own runs on a GPU: every measured serving run under a
results root rebuilt from its own overrides with ``executor=sim`` under each cost model, and batches,
iteration times, served latencies and the pd_ratio gains compared (docs/sim/README.md, section 9).

The measured runs are not in git: ``--runs`` names their root (``<experiment>/multiruns/<sweep>/<job>/``,
as the GPU suite writes it). ``--smoke`` measures four tiny pd_ratio runs and a tiny profile on this
CPU first and compares against those: the same code path at CI size."""
from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab import provenance
from sarathi_lab.analysis import claims, derive
from sarathi_lab.analysis.runs import Results
from sarathi_lab.bench.args import bench_parser
from sarathi_lab.bench.sim_validate import (
    DOCS,
    SERVED,
    SMOKE_PROFILE,
    Run,
    batch_errors,
    parity,
    profile,
    served_errors,
    verdict,
)
from sarathi_lab.engine.metrics import STALL, iteration_kinds, stalled
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.environment import engine_kind
from sarathi_lab.harness.results import METRICS, natural_order, override_key, read_record

COST_MODELS = ("roofline", "profile")
LATENCIES = (*SERVED[:3], "tpot_p50_s", "tpot_p99_s", *SERVED[3:])
# Keys of the measured run's command line its simulated rebuild sets itself (or must not inherit).
_NOT_CARRIED = {"executor", "engine.sim_device", "engine.sim_cost_model", "logger", "on_existing"}
# A measured run's keys that name it in the tables.
_KEYS = ("scheduler", "chunk", "batch_size", "seq_len", "pd_ratio", "model", "dtype")
# The smoke's runs: pd_ratio at CI size on the tiny model, static then sarathi at two P:D ratios.
_SMOKE = ["experiment=pd_ratio", "model=tiny", "device=cpu", "dtype=float32", "seq_len=48", "batch_size=2",
          "chunk=16", "workload.num_requests=4", "logger=none", "on_existing=overwrite"]


def finished_runs(root: Path) -> tuple[list[Path], Counter]:
    """The finished, measured (not simulated) serving runs under ``root``, in sweep order, and how many
    of the other finished runs there were left out, by why (their experiment and task, or partial)."""
    found, left_out = [], Counter()
    for metrics in sorted(root.glob(f"*/multiruns/*/*/{METRICS}"), key=natural_order):
        record = read_record(metrics)
        task, executor = record["config"].get("task"), record["environment"].get("executor")
        if record.get("partial"):
            left_out["partial (interrupted)"] += 1
        elif executor != "model":
            left_out[f"executor={executor}"] += 1
        elif task != "serve":
            left_out[f"{metrics.relative_to(root).parts[0]} (task={task}, not serving)"] += 1
        else:
            found.append(metrics.parent)
    return found, left_out


def serving_runs(root: Path) -> list[Path]:
    """The finished, measured (not simulated) serving runs under ``root``, in sweep order."""
    return finished_runs(root)[0]


def measured_engine(runs: list[Path]) -> str:
    """What the measured runs' engine was (eager / decode CUDA graphs), from their environment records."""
    return engine_kind([read_record(run / METRICS)["environment"] for run in runs]) or "no run"


def overrides_of(run_dir: Path) -> list[str]:
    """The run's command line (metrics.json's copy of Hydra's, which every finished run holds), less
    what a simulated rebuild sets itself."""
    given = read_record(run_dir / METRICS)["overrides"]
    return [o for o in given if override_key(o) not in _NOT_CARRIED and not o.startswith("hydra")]


def simulate(run_dir: Path, runs: Path, work: Path, device: str, cost_model: str) -> Path:
    """The run rebuilt on ``device`` under ``cost_model``, into ``work/<cost_model>/`` at the same
    place as under ``runs`` (so that ``Results`` reads both roots alike)."""
    dest = work / cost_model / run_dir.relative_to(runs)
    run_in_process([*overrides_of(run_dir), "executor=sim", f"engine.sim_device={device}",
                    f"engine.sim_cost_model={cost_model}", "logger=none", "on_existing=overwrite"], dest)
    return dest


def load(run_dir: Path) -> Run:
    return Run(pd.read_parquet(run_dir / "iterations.parquet"), read_record(run_dir / METRICS)["summary"], math.nan)


def stalls(iterations: pd.DataFrame) -> pd.Series:
    """The run's stalled iterations (``engine.metrics.stalled``): pauses of the real engine, which no
    cost model predicts and which a makespan or a gain carries whole."""
    kinds = iteration_kinds(iterations.num_prefill_tokens, iterations.num_decode_tokens)
    return pd.Series(stalled(iterations.duration_s, kinds), index=iterations.index)


def compare(runs: Path, work: Path, device: str, cost_models=COST_MODELS, progress=print):
    """(one row per measured run and cost model, the iterations of identically batched runs with
    their measured and simulated seconds)."""
    rows, points = [], []
    for run_dir in serving_runs(runs):
        record = read_record(run_dir / METRICS)
        real = load(run_dir)
        ident = {"experiment": record["config"].get("experiment"), "job": run_dir.name,
                 **{k: record["config"].get(k) for k in _KEYS},
                 "measured_on": record["environment"].get("device_name"),
                 "measured_timing_unreliable": bool(record["environment"].get("timing_unreliable"))}
        stalled = stalls(real.iterations)
        for model in cost_models:
            sim = load(simulate(run_dir, runs, work, device, model))
            row = ident | {"cost_model": model, "iterations_real": len(real.iterations),
                           "iterations_sim": len(sim.iterations)} | batch_errors(real, sim)
            row |= {"real_stall_iterations": int(stalled.sum()),
                    "real_stall_s": float(real.iterations.duration_s[stalled].sum())}
            row |= served_errors(real, sim, LATENCIES)
            row |= {f"{k}_sim": sim.summary[k] for k in LATENCIES}
            rows.append(row)
            if row["identical_batches"]:
                it = real.iterations
                points.append(pd.DataFrame({"job": run_dir.name, "scheduler": ident["scheduler"], "cost_model": model,
                                            "kind": iteration_kinds(it.num_prefill_tokens, it.num_decode_tokens),
                                            "num_tokens": it.num_tokens, "stall": stalled.to_numpy(),
                                            "num_decode_tokens": it.num_decode_tokens, "measured_s": it.duration_s,
                                            "simulated_s": sim.iterations.duration_s.to_numpy()}))
            progress(f"{ident['experiment']}/{run_dir.name.split('_')[0]} {ident['scheduler']} chunk {ident['chunk']} "
                     f"P:D {ident['pd_ratio']}, {model}: {verdict(row)}")
    return pd.DataFrame(rows), pd.concat(points, ignore_index=True) if points else pd.DataFrame()


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per cost model: how many runs batched identically, the spread of the per-run iteration
    errors and of each served metric's error over the runs."""
    out = []
    for model, group in table.groupby("cost_model", sort=False):
        row = {"cost_model": model, "runs": len(group), "identical_batches": int(group.identical_batches.sum())}
        for key in ("iter_median_abs_rel_err", *(f"{k}_rel_err" for k in LATENCIES)):
            values = group.get(key, pd.Series(dtype=float))
            row |= {f"{key}_median": values.median(), f"{key}_min": values.min(), f"{key}_max": values.max()}
        out.append(row)
    return pd.DataFrame(out)


def by_kind(points: pd.DataFrame) -> pd.DataFrame:
    """The iterations by cost model, kind (decode, prefill, hybrid) and size (up to a
    chunk or whole prompts): medians of the measured and simulated times and of the error."""
    err = points.simulated_s / points.measured_s - 1
    size = np.where(points.num_tokens > 512, "513+ tokens", "1-512 tokens")
    frame = points.assign(rel_err=err, abs_rel_err=err.abs(), tokens=size)
    return (frame.groupby(["cost_model", "kind", "tokens"], sort=False)
            .agg(iterations=("rel_err", "size"), measured_ms=("measured_s", "median"),
                 simulated_ms=("simulated_s", "median"), median_rel_err=("rel_err", "median"),
                 median_abs_rel_err=("abs_rel_err", "median"))
            .assign(measured_ms=lambda f: f.measured_ms * 1e3, simulated_ms=lambda f: f.simulated_ms * 1e3)
            .reset_index())


def gains(runs: Path, work: Path, cost_models=COST_MODELS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """pd_ratio's gain over the baseline per point, measured beside each cost model's (the claim's
    own derivation, ``derive.pd_ratio_gains``), and the claims rows of all of them (``claims_table``).
    Runs flagged timing-unreliable are kept, as in the per-run table: the simulation rebuilt every run."""
    keys = [*derive.WORKLOAD_KEYS, "chunk"]
    measured = Results(runs, include_unreliable=True)
    table = derive.pd_ratio_gains(measured.summary("pd_ratio"))[[*keys, "gain"]].rename(columns={"gain": "measured"})
    simulated = [Results(work / m) for m in cost_models]
    for model, results in zip(cost_models, simulated):
        each = derive.pd_ratio_gains(results.summary("pd_ratio"))[[*keys, "gain"]].rename(columns={"gain": model})
        table = table.merge(each, on=keys, how="left")
    return table, claims.claims_table(measured, simulated, only=["pd_ratio"])


def figure(points: pd.DataFrame, table: pd.DataFrame, gain: pd.DataFrame | None, title: str, path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no figure to close

    panels = 3 if gain is not None and len(gain) else 2
    fig = Figure(figsize=(5 * panels, 4.6))
    axes = fig.subplots(1, panels)
    colours = dict(zip(COST_MODELS, ("tab:orange", "tab:blue")))
    left = axes[0]
    for model, group in points.groupby("cost_model", sort=False):
        kept, stalled = group[~group.stall], group[group.stall]
        left.scatter(kept.measured_s * 1e3, kept.simulated_s * 1e3, s=4, alpha=0.35, color=colours.get(model),
                     label=model, rasterized=True)
        left.scatter(stalled.measured_s * 1e3, stalled.simulated_s * 1e3, s=30, marker="x", color=colours.get(model))
    if points.stall.any():
        left.scatter([], [], s=15, marker="x", color="k", label=f"measured stall (> {STALL:g}x its kind's median)")
    parity(left, points.measured_s, points.simulated_s, "every iteration (identical batches)", "simulated = measured")
    left.legend(fontsize=8, markerscale=2)
    middle, keys = axes[1], ["makespan_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s", "itl_p99_s"]
    for i, model in enumerate(m for m in COST_MODELS if m in set(table.cost_model)):
        rows = table[table.cost_model == model]
        for j, key in enumerate(keys):
            x = j + (i - 0.5) * 0.3 + np.linspace(-0.08, 0.08, len(rows))
            middle.scatter(x, 100 * rows[f"{key}_rel_err"], s=10, color=colours.get(model),
                           label=model if j == 0 else None)
    middle.axhline(0, color="k", lw=0.8)
    middle.axhspan(-10, 10, color="0.9", zorder=-1, label="within 10%")
    middle.set_xticks(range(len(keys)), [k.removesuffix("_s") for k in keys], rotation=25, fontsize=8)
    middle.set(ylabel="simulated / measured - 1 (%)", title=f"served metrics, {table.job.nunique()} runs")
    middle.legend(fontsize=8)
    if panels == 3:
        right = axes[2]
        for chunk, group in gain.groupby("chunk"):
            style = "-" if chunk == gain.chunk.min() else "--"
            group = group.sort_values("pd_ratio")
            right.plot(group.pd_ratio, group.measured, style, color="k", marker="o", label=f"measured, chunk {chunk:g}")
            for model in (m for m in COST_MODELS if m in group):
                right.plot(group.pd_ratio, group[model], style, color=colours[model], marker="s", ms=4,
                           label=f"{model}, chunk {chunk:g}")
        right.axhline(1, color="0.5", lw=0.8)
        right.set(xscale="log", xlabel="P:D (prompt / decode tokens)", ylabel="sarathi throughput / static's (x)",
                  title="pd_ratio: gain over the baseline")
        ratios = sorted(gain.pd_ratio.unique())
        right.set_xticks(ratios, [f"{r:g}" for r in ratios])
        right.minorticks_off()
        right.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _smoke_runs(root: Path) -> None:
    """Four tiny pd_ratio runs measured on this CPU, laid out as a sweep."""
    for i, (ratio, scheduler) in enumerate((r, s) for r in (4, 16) for s in ("static", "sarathi")):
        run_in_process([*_SMOKE, f"pd_ratio={ratio}", f"scheduler={scheduler}"],
                       root / "pd_ratio" / "multiruns" / "smoke" / f"{i}_pd_ratio={ratio},scheduler={scheduler}")


def outputs(out: Path, stem: str) -> list[Path]:
    """Every file main writes for ``stem``."""
    return [out / f"{stem}{part}" for part in (".csv", "_summary.csv", "_gains.csv", "_claims.csv",
                                                "_iterations.csv", ".png")]


def comparison_provenance(runs: list[Path], device: str) -> provenance.Provenance:
    """The comparison's: the simulated device and cost models, the machines that measured the runs, what
    their engine was and the commits the runs ran at."""
    envs = [read_record(run / METRICS)["environment"] for run in runs]
    return provenance.Provenance(f"simulated {device} ({'+'.join(COST_MODELS)}) against measured runs "
                                 f"({engine_kind(envs)})",
                                 machine="+".join(sorted({str(e.get("device_name")) for e in envs})),
                                 commit=provenance.commits(e.get("git_commit") for e in envs),
                                 writer="python -m sarathi_lab.bench sim_vs_gpu")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__spec__, __doc__)
    parser.add_argument("--runs", type=Path, default=None, help="the measured runs' results root (required "
                        "unless --smoke): <experiment>/multiruns/<sweep>/<job>/")
    parser.add_argument("--out", type=Path, default=None, help="where the tables and figure go "
                        "(default docs/sim; with --smoke sim_vs_gpu_smoke)")
    parser.add_argument("--work", type=Path, default=None, help="where the simulated runs go "
                        "(default outputs/sim_vs_gpu; with --smoke OUT/work)")
    parser.add_argument("--device", default="h200", help="the simulated device: the one the runs were measured on")
    parser.add_argument("--smoke", action="store_true", help="measure tiny runs and a profile on this CPU first "
                        "and compare against them (device cpu)")
    parser.add_argument("--force", action="store_true",
                        help="replace a comparison of other runs (another machine or commit) in OUT")
    args = parser.parse_args(argv)
    out = args.out or (Path("sim_vs_gpu_smoke") if args.smoke else DOCS)
    work = args.work or (out / "work" if args.smoke else Path("outputs") / "sim_vs_gpu")
    device, runs = ("cpu", out / "measured") if args.smoke else (args.device, args.runs)
    if runs is None:
        parser.error("--runs is required (the measured runs' results root), unless --smoke")
    if not args.smoke and not serving_runs(runs):
        parser.error(f"--runs {runs} is invalid: it holds no finished measured serving run "
                     "(<experiment>/multiruns/<sweep>/<job>/metrics.json with task serve)")
    stem = f"validation_{device}"
    if not args.smoke:
        try:
            provenance.check(dict.fromkeys(outputs(out, stem), comparison_provenance(serving_runs(runs), device)),
                             args.force, "--force replaces them; --out DIR writes elsewhere")
        except provenance.ReplaceRefused as e:
            parser.error(str(e))
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:  # never the committed profiles: the tiny one is measured into OUT
        os.environ.setdefault("SARATHI_PROFILES_DIR", str(out / "profiles"))
        profile("tiny", **SMOKE_PROFILE)
        _smoke_runs(runs)
    compared, left_out = finished_runs(runs)
    total = len(compared) + sum(left_out.values())
    print(f"comparing {len(compared)} of {total} finished runs under {runs}"
          + ("; left out: " + ", ".join(f"{n} {why}" for why, n in left_out.items()) if left_out else ""), flush=True)
    table, points = compare(runs, work, device, progress=lambda m: print(m, flush=True))
    table.to_csv(out / f"{stem}.csv", index=False, float_format="%.4g")
    summarize(table).to_csv(out / f"{stem}_summary.csv", index=False, float_format="%.4g")
    gain = None
    if (runs / "pd_ratio").is_dir():
        gain, claim_rows = gains(runs, work)
        gain.to_csv(out / f"{stem}_gains.csv", index=False, float_format="%.4g")
        claim_rows.to_csv(out / f"{stem}_claims.csv", index=False)
    if not points.empty:
        by_kind(points).to_csv(out / f"{stem}_iterations.csv", index=False, float_format="%.4g")
        first = table.iloc[0]
        engine = measured_engine(compared)
        title = (f"Simulator ({' and '.join(COST_MODELS)} cost models, sim_device={device})\nagainst this engine "
                 f"measured on {first['measured_on']}: {first['model']}, {first['dtype']}, {engine}"
                 + (f"\nmeasured side: this engine ({engine}), not the hardware's limit" if device != "cpu" else ""))
        figure(points, table, gain, title, out / f"{stem}.png")
    provenance.record({path: comparison_provenance(compared, device) for path in outputs(out, stem) if path.is_file()})
    print(f"wrote {out / f'{stem}.csv'} ({table.job.nunique()} runs x {len(COST_MODELS)} cost models)")


if __name__ == "__main__":
    main()
