"""The simulator checked against the real engine on this machine: the same requests through
``LLM(executor="model")`` and ``LLM(executor="sim", sim_cost_model="profile")`` (docs/sim/README.md,
section 1)."""
from __future__ import annotations

import io
import math
import os
import statistics
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.config import KV_WATERMARK, REPO_ROOT, EngineConfig
from sarathi_lab.engine.block_manager import blocks_beside_watermark, blocks_for
from sarathi_lab.engine.clock import Clock, CPUClock, WallClock
from sarathi_lab.engine.metrics import iteration_kinds
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.harness.arrivals import poisson_arrivals
from sarathi_lab.harness.schema import MeasureCfg
from sarathi_lab.harness.workloads import split_length
from sarathi_lab.measure.bench.args import bench_parser
from sarathi_lab.measure.profiling import cpu_ceilings
from sarathi_lab.measure.profiling.machine import machine_record
from sarathi_lab.measure.sim_check import parity
from sarathi_lab.measure.sim_check.point_table import (
    COST_MODEL,
    KIND,
    MEASURED,
    PREDICTED,
    SOURCE,
    rel_err,
    summary,
)
from sarathi_lab.sim.profiles import profile_description, profile_path

# Fields that say what was batched, not how long it took.
COMPOSITION = ("num_prefill_tokens", "num_decode_tokens", "num_prefill_requests",
               "num_decode_requests", "kv_tokens_read", "num_preempted")
BLOCK_SIZE = EngineConfig.block_size
# The tiny model's profile for the smoke runs: every shape they batch.
SMOKE_PROFILE = {"max_tokens": 160, "chunk": 32, "batch": 8, "seq_len": 64, "reps": 1,
                 "token_step": 16}
SERVED = ("makespan_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
# validation_iterations.csv's: point_table's points, less what is the same in every row.
ITERATION_COLUMNS = ("workload", "scheduler", "chunk", "num_tokens", MEASURED, PREDICTED)
DOCS = REPO_ROOT / "docs" / "sim"


def _on_clock(llm, clock: Clock | None):
    if clock is not None:
        llm.engine.clock = llm.engine.executor.clock = clock
    return llm


@dataclass(frozen=True)
class Case:
    workload: str
    scheduler: str
    chunk: int
    batch: int
    lengths: tuple[tuple[int, int], ...]
    arrivals: tuple[float, ...] | None = None
    repeat_real: bool = False                       # run the real engine twice: its own spread

    @property
    def longest(self) -> int:
        """What orca and static reserve for each request."""
        return max(p + d for p, d in self.lengths)

    @property
    def kv_blocks(self) -> int:
        """The same on both engines, so that admission and preemption decide alike."""
        return blocks_beside_watermark(self.batch * blocks_for(self.longest, BLOCK_SIZE),
                                       KV_WATERMARK)


def cases(smoke: bool = False) -> list[Case]:
    """The default sweep scaled to this machine (docs/sim/README.md, section 1)."""
    rng, names = np.random.default_rng(0), scheduler_names()
    # Only the chunking schedulers read the chunk, so the others run once.
    sweep = ((48, 2),) * 2 if smoke else ((768, 16),) * 3
    chunks = (16, 32) if smoke else (256, 512, 1024)
    out = [Case("default_sweep", s, c, 4, sweep, repeat_real=(s == "sarathi" and c == chunks[1]))
           for s in names for c in (chunks if s.startswith("sarathi") else chunks[1:2])]
    n, total, chunk = (4, 48, 16) if smoke else (8, 256, 64)
    out += [Case(f"pd_ratio_{ratio}", s, chunk, 4, (split_length(total, ratio),) * n)
            for ratio in (4, 32) for s in names]
    n, lo, hi, chunk, qps = (4, 16, 48, 16, 50.0) if smoke else (8, 128, 512, 64, 1.0)
    lengths = tuple(split_length(int(t), 4) for t in rng.integers(lo, hi + 1, size=n))
    arrivals = tuple(poisson_arrivals(n, qps, rng))
    return out + [Case("scheduler_latency", s, chunk, 8, lengths, arrivals,
                       repeat_real=(s == "sarathi"))
                  for s in names]


def profile(model: str, max_tokens: int, chunk: int, batch: int, seq_len: int, reps: int = 2,
            token_step: int = 160, clock: Clock | None = None) -> Path:
    """``task=profile``'s own code on this CPU, into ``profiles/cpu/<model>.csv``."""
    from sarathi_lab import LLM
    from sarathi_lab.measure.tasks import profile as task

    # oneDNN's kernels have no GEMM tile steps worth a point.
    cfg = SimpleNamespace(chunk=chunk, batch_size=batch, seq_len=seq_len, seed=0,
                          model=SimpleNamespace(engine_model=model),
                          measure=MeasureCfg(reps=reps, token_step=token_step, tile=1 << 20,
                                             max_tokens=max_tokens))
    top = max(max_tokens, chunk + seq_len)
    blocks = blocks_for(top, BLOCK_SIZE) + batch * blocks_for(seq_len, BLOCK_SIZE) + 8
    llm = LLM(model, device="cpu", dtype="float32", max_batch_size=batch, chunk_size=chunk,
              num_threads=1, max_model_len=top, num_kv_blocks=blocks, warmup_iters=1)
    task.run(cfg, _on_clock(llm, clock))
    return profile_path("cpu", model)


class Run(NamedTuple):
    iterations: pd.DataFrame
    summary: dict[str, float]
    cpu_s: float


def run_case(case: Case, model: str, clock: Clock | None = None, **engine) -> Run:
    """On one thread, as its profile was measured."""
    from sarathi_lab import LLM
    from sarathi_lab.engine.sequence import SamplingParams

    llm = LLM(model, device="cpu", dtype="float32", scheduler=case.scheduler, chunk_size=case.chunk,
              max_batch_size=case.batch, num_kv_blocks=case.kv_blocks, max_model_len=case.longest,
              num_threads=1, seed=0, **engine)
    _on_clock(llm, clock)
    rng = np.random.default_rng(1)
    vocab = llm.model_config.vocab_size
    prompts = [rng.integers(0, vocab, size=p).tolist() for p, _ in case.lengths]
    started = time.process_time()
    llm.generate(prompts, [d for _, d in case.lengths], sampling=SamplingParams(ignore_eos=True),
                 arrival_times=None if case.arrivals is None else list(case.arrivals))
    return Run(pd.DataFrame(llm.metrics.iteration_rows()), llm.metrics.summary(),
               time.process_time() - started)


def host_probe(model: str, path: Path, clock: Clock | None = None, reps: int = 5):
    """How much slower than while profiled the host runs now (1.1: 10%), from the profile's drift
    reference: the simulator cannot know the host moved. NaN without one."""
    drift = profile_description(path).get("drift")
    if not drift:
        return lambda: math.nan
    from sarathi_lab import LLM
    from sarathi_lab.measure.profiling.batches import SyntheticBatches
    from sarathi_lab.measure.tasks.profile import reference_forward_s

    ref = drift["reference"]
    longest = ref["context"] + BLOCK_SIZE
    blocks = ref["decodes"] * blocks_for(longest, BLOCK_SIZE) + 8
    llm = LLM(model, device="cpu", dtype="float32", max_batch_size=ref["decodes"], num_threads=1,
              max_model_len=longest, num_kv_blocks=blocks)
    batches = SyntheticBatches(_on_clock(llm, clock))
    profiled_s = statistics.median(drift.get("series_s") or (drift["first_s"], drift["last_s"]))
    return lambda: reference_forward_s(llm, batches, ref, reps) / profiled_s


def batch_errors(real: Run, sim: Run) -> dict:
    """Iteration counts; whether the simulation made the real run's batches; where so, errors."""
    batched = [run.iterations[list(COMPOSITION)].to_numpy() for run in (real, sim)]
    same = len(real.iterations) == len(sim.iterations) and (batched[0] == batched[1]).all()
    row = {"iterations_real": len(real.iterations), "iterations_sim": len(sim.iterations),
           "identical_batches": bool(same)}
    if same:
        err = summary(rel_err(sim.iterations.duration_s, real.iterations.duration_s))
        row["iter_median_abs_rel_err"] = err["median_abs_rel_err"]
        row["iter_median_rel_err"] = err["median_rel_err"]
        row["busy_rel_err"] = rel_err(sim.iterations.duration_s.sum(),
                                      real.iterations.duration_s.sum())
    return row


def served_errors(real: Run, sim: Run, keys=SERVED) -> dict:
    row = {}
    for key in keys:
        row[f"{key}_real"] = real.summary[key]
        row[f"{key}_rel_err"] = rel_err(sim.summary[key], real.summary[key])
    return row


def compare(case: Case, real: Run, sim: Run, again: Run | None = None) -> dict:
    """Signed relative errors sim/real - 1, and again/real - 1 for the real engine's own spread."""
    row = {"workload": case.workload, "scheduler": case.scheduler, "chunk": case.chunk,
           "batch": case.batch, "requests": len(case.lengths),
           "arrival": "all_at_once" if case.arrivals is None else "poisson"}
    row |= batch_errors(real, sim)
    # A Poisson repeat may batch differently: then no per-iteration spread.
    row["real_iter_median_abs_rel_spread"] = float("nan")
    if again is not None and len(again.iterations) == len(real.iterations):
        spread = summary(rel_err(again.iterations.duration_s, real.iterations.duration_s))
        row["real_iter_median_abs_rel_spread"] = spread["median_abs_rel_err"]
    for key in SERVED:
        row |= served_errors(real, sim, (key,))
        if again is not None:
            row[f"{key}_real_spread"] = rel_err(again.summary[key], real.summary[key])
    return row


def validate(model: str = "cpu-small", which: list[Case] | None = None, cpu_clock: bool = False,
             progress=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The profile must exist, measured on the same clock (``cpu_clock``, else the wall one)."""
    rows, points = [], []
    clock = CPUClock if cpu_clock else lambda: None
    probe = host_probe(model, profile_path("cpu", model), clock())
    cpu_ceilings.ensure("float32")
    for case in which or cases():
        slowdown = probe()
        real = run_case(case, model, clock())
        again = run_case(case, model, clock()) if case.repeat_real else None
        sim = run_case(case, model, executor="sim", sim_device="cpu", sim_cost_model="profile")
        row = compare(case, real, sim, again) | {"sim_cpu_s": sim.cpu_s,
                                                 "host_slowdown_vs_profile": slowdown}
        rows.append(row)
        if row["identical_batches"]:
            points.append(iteration_points(case, real, sim))
        progress(f"{case.workload}/{case.scheduler}/c{case.chunk}: {verdict(row)}")
    return pd.DataFrame(rows), pd.concat(points, ignore_index=True) if points else pd.DataFrame()


def iteration_points(case: Case, real: Run, sim: Run) -> pd.DataFrame:
    """Every iteration of a run the simulation batched alike, as point_table's points."""
    its = real.iterations
    return pd.DataFrame({
        SOURCE: "this engine measured on this CPU", KIND: iteration_kinds(
            its.num_prefill_tokens, its.num_decode_tokens), COST_MODEL: "profile",
        PREDICTED: sim.iterations.duration_s.to_numpy(), MEASURED: its.duration_s.to_numpy(),
        "workload": case.workload, "scheduler": case.scheduler, "chunk": case.chunk,
        "num_tokens": its.num_tokens.to_numpy()})


def verdict(row: dict) -> str:
    slowdown = row.get("host_slowdown_vs_profile", math.nan)
    return (f"identical batches {row['identical_batches']}, "
            f"iteration error {row.get('iter_median_abs_rel_err', math.nan):.1%}, "
            f"makespan {row['makespan_s_rel_err']:+.1%}"
            + ("" if math.isnan(slowdown)
               else f", host at {slowdown:.2f}x the profile's reference time"))


def figure(points: pd.DataFrame, table: pd.DataFrame, path: Path, title: str = "") -> None:
    """The Poisson runs' served metrics beside the real engine's own repeat."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    parity.draw(left, points, "identical batches: iteration by iteration", colour_by="workload")
    poisson = table[table.arrival == "poisson"]
    keys = list(SERVED)
    width = 0.8 / max(len(poisson), 1)
    for i, (_, row) in enumerate(poisson.iterrows()):
        right.bar(np.arange(len(keys)) + i * width, [100 * row[f"{k}_rel_err"] for k in keys],
                  width, label=row.scheduler)
    for _, row in poisson[poisson[f"{keys[0]}_real_spread"].notna()].iterrows():
        right.scatter(np.arange(len(keys)) + 0.4 - width / 2,
                      [100 * row[f"{k}_real_spread"] for k in keys], marker="x", color="black",
                      zorder=3, label=f"real {row.scheduler} against its repeat")
    right.axhspan(-10, 10, color="0.9", zorder=-1, label="within 10%")
    right.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, keys, rotation=20, fontsize=8)
    right.set(ylabel="simulated / measured - 1 (%)", title="Poisson arrivals: served metrics")
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, format="png", dpi=90)


def validation_provenance(smoke: bool) -> provenance.Provenance:
    from sarathi_lab.code_commit import source_commit

    return provenance.Provenance("measured CPU against simulated CPU (profile)",
                                 "ci" if smoke else "full", machine=machine_record().get("cpu", ""),
                                 commit=provenance.commits([source_commit()[0]]),
                                 writer="python -m sarathi_lab.measure sim_validate")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("sim_validate", __doc__)
    cli_args.shared(parser, smoke="model tiny at CI size (profile into OUT)",
                    out="where the table and figure go (default docs/sim)",
                    force="replace a validation of another scale, machine or commit in OUT")
    parser.add_argument("--reprofile", action="store_true",
                        help="measure the profile again even if one exists")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what the real engine and the profile are timed on: CPUClock "
                             "(default; this machine's cores are shared) or the wall clock (files "
                             "get a _wall suffix)")
    args = parser.parse_args(argv)
    cpu_clock = args.clock == "cpu"
    suffix = "" if cpu_clock else "_wall"
    out = args.out or (Path("sim_validation_smoke") if args.smoke else DOCS)
    outputs = output_files.Outputs(out, dict.fromkeys(
        (f"validation{suffix}.csv", f"validation_iterations{suffix}.csv",
         f"validation{suffix}.png"), validation_provenance(args.smoke)),
        given=f"--out={out}", force=args.force,
        how="--force replaces them; --out DIR writes elsewhere")
    try:
        outputs.check()
    except output_files.OutputRefused as e:
        parser.error(str(e))
    out.mkdir(parents=True, exist_ok=True)  # a smoke run's profile goes there first
    if args.smoke:  # never overwrite the committed profile with a CI one
        os.environ.setdefault("SARATHI_PROFILES_DIR", str(out / "profiles"))
    model = "tiny" if args.smoke else "cpu-small"
    needs = SMOKE_PROFILE if args.smoke else {"max_tokens": 2400, "chunk": 1024, "batch": 8,
                                              "seq_len": 784, "token_step": 300}
    path, clock = profile_path("cpu", model), (CPUClock if cpu_clock else WallClock).__name__
    if args.reprofile or not path.is_file():
        print(f"profiling {model} into {path}")
        profile(model, **needs, clock=CPUClock() if cpu_clock else None)
    elif (timed_on := profile_description(path).get("clock")) not in (None, clock):
        # The real engine and the profile must read one clock.
        parser.error(f"--clock {args.clock} is invalid with the profile {path}: it was timed on "
                     f"{timed_on}, not {clock} (--reprofile measures it again on {clock})")
    table, points = validate(model, cases(args.smoke), cpu_clock=cpu_clock,
                             progress=lambda m: print(m, flush=True))
    outputs.add(f"validation{suffix}.csv", table.to_csv(index=False, float_format="%.4g"))
    outputs.add(f"validation_iterations{suffix}.csv",
                (points[list(ITERATION_COLUMNS)] if len(points) else points).to_csv(
                    index=False, float_format="%.5g"))
    if not points.empty:
        machine = profile_description(path).get("machine", {})
        title = (f"Simulator (profile cost model, {path.parent.name}/{path.name}) against this "
                 f"engine measured on {machine.get('cpu', '?')}, {machine.get('cores', '?')} "
                 f"cores, last-level cache {machine.get('llc_mib', '?')} MiB (isa "
                 f"{machine.get('isa', '?')}): {model}, float32, one thread, both timed on {clock}")
        png = io.BytesIO()
        figure(points, table, png, "\n".join(textwrap.wrap(title, 120)))
        outputs.add(f"validation{suffix}.png", png.getvalue())
    try:
        outputs.write()
    except output_files.OutputRefused as e:
        parser.error(str(e))
    print(f"wrote {out / f'validation{suffix}.csv'} ({len(table)} cases)")
