"""Pipeline bubbles of best-case Orca against SARATHI's chunked prefills, GPT-3 on TP8 x PP8 A100s,
and Orca on 8 TP8 replicas, served by the engine's loop over the simulated pipeline, with how far
each open choice moves the headline (docs/sim/README.md, section 2)."""
from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab import cli_args, code_commit, output_files, provenance, sim
from sarathi_lab.analysis.paper_results.pipeline_bubbles import PAPER
from sarathi_lab.config import KV_WATERMARK, REPO_ROOT, EngineConfig
from sarathi_lab.engine.block_manager import BlockManager, blocks_for
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.measure.bench.args import bench_parser, positive_int
from sarathi_lab.measure.bench.trace import requests_refused
from sarathi_lab.measure.sim_check.pipeline_setup import FLIPS, PipelineSetup
from sarathi_lab.sim.build import kv_capacity_tokens
from sarathi_lab.sim.cost_model import CostModel
from sarathi_lab.sim.device import load_device
from sarathi_lab.sim.parallel import HostOverlapped, PipelineCostModel
from sarathi_lab.sim.pipeline_run import PipelineRun, serve_pipeline
from sarathi_lab.sim.sharding import shard

# GPT-3's shape in a config-only directory: no weights, which load_config would refuse.
GPT3 = str(Path(sim.__file__).with_name("models") / "gpt3")
DTYPE = "float16"
FILES = ("pipeline_bubbles.csv", "pipeline_summary.csv", "pipeline_sensitivity.csv",
         "pipeline_bubbles.png")
# The headline: each ratio's name, what it divides, and the paper's figure (§5.3).
HEADLINE = (
    ("median_bubble_ratio", "orca_tp_pp", "sarathi_tp_pp", "median_bubble_s",
     "median_bubble_ratio"),
    ("end_to_end_orca_tp_pp", "orca_tp_pp", "sarathi_tp_pp", "makespan_s", "end_to_end_ratio"),
    ("end_to_end_tp_only", "orca_tp_only", "sarathi_tp_pp", "makespan_s", "tp_only_ratio"),
    ("tp_only_over_orca_tp_pp", "orca_tp_pp", "orca_tp_only", "makespan_s", "tp_only_over_orca"),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    scheduler: str
    pipelined: bool
    ignores: tuple[str, ...]  # the setup's knobs its runs never read

    def key(self, setup: PipelineSetup) -> tuple:
        return tuple(v for k, v in setup.knobs().items() if k not in self.ignores)


SCENARIOS = (
    Scenario("orca_tp_pp", "orca", True, ("chunk_align", "tp_only_batch")),
    Scenario("sarathi_tp_pp", "sarathi", True, ("orca_prompts", "tp_only_batch")),
    Scenario("orca_tp_only", "orca", False, ("chunk_align", "batch", "collect")),
)


def label(scenario: str, setup: PipelineSetup) -> str:
    orca = "Orca best case" if setup.orca_prompts == 1 else "Orca"
    return {"orca_tp_pp": f"{orca}, TP{setup.tp} x PP{setup.pp}",
            "sarathi_tp_pp": f"SARATHI, TP{setup.tp} x PP{setup.pp}",
            "orca_tp_only": f"{orca}, {setup.replicas} x TP{setup.tp}"}[scenario]


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


@functools.cache
def gpt3():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(GPT3)


def stage_costs(setup: PipelineSetup, pp: int):
    """The roofline of one GPU's shard, two ring all-reduces a layer, sends between stages; the
    cost model's host step on stage 0 unless ``stage0_host`` is off."""
    config = gpt3()
    cost = CostModel.for_device(setup.device, config, "roofline", DTYPE, tp=setup.tp, pp=pp)
    if pp == 1:  # TP alone: one stage, so that both scenarios run through the same executor
        cost = PipelineCostModel(cost, config, setup.tp, 1, DTYPE)
    return cost if setup.stage0_host else HostOverlapped(cost)


def cache(setup: PipelineSetup, pp: int, batch: int) -> BlockManager:
    """The KV cache one GPU of a stage holds (its layers' and heads' of every request in flight):
    the shard's capacity is the pipeline's."""
    tokens = kv_capacity_tokens(load_device(setup.device, DTYPE), shard(gpt3(), setup.tp, pp),
                                2, setup.chunk + batch)
    return BlockManager(tokens // EngineConfig.block_size, EngineConfig.block_size, KV_WATERMARK)


def largest_batch(setup: PipelineSetup, pipelined: bool) -> int:
    """The most requests a micro-batch (a replica's batch) may hold with Orca's max_model_len
    reserved for each of them in every micro-batch in flight."""
    pp = setup.pp if pipelined else 1
    blocks = cache(setup, pp, setup.batch if pipelined else setup.tp_only_batch)
    need = blocks_for(gpt3().max_position_embeddings, blocks.block_size)
    return blocks.admissible_blocks // (need * pp)


def within_device(setup: PipelineSetup) -> bool:
    """Both scenarios' batches fit the device's KV cache (else a what-if beyond the paper's)."""
    return (setup.batch <= largest_batch(setup, True)
            and setup.tp_only_batch <= largest_batch(setup, False))


def scheduler(setup: PipelineSetup, scenario: Scenario, pp: int, batch: int):
    knobs = ({"max_prompts": setup.orca_prompts} if scenario.scheduler == "orca"
             else {"chunk_align": setup.chunk_align})
    return make_scheduler(scenario.scheduler, cache(setup, pp, batch), knobs,
                          max_batch_size=batch, chunk_size=setup.chunk,
                          max_model_len=gpt3().max_position_embeddings)


def serve(setup: PipelineSetup, scenario: Scenario) -> list[PipelineRun]:
    """One run through TP x PP, or one a replica of TP alone, each with every ``replicas``-th
    request (round robin)."""
    lengths = zipf_lengths(setup.requests, setup.min_tokens, setup.max_tokens, setup.theta,
                           setup.pd_ratio, setup.seed)
    pp, batch, groups = ((setup.pp, setup.batch, [lengths]) if scenario.pipelined else
                         (1, setup.tp_only_batch,
                          [lengths[i::setup.replicas] for i in range(setup.replicas)]))
    cost = stage_costs(setup, pp)
    return [serve_pipeline(scheduler(setup, scenario, pp, batch), cost, group,
                           collect_as_leaves=setup.collect_as_leaves) for group in groups if group]


class Runner:
    """Each scenario served once for the knobs it reads, however many setups share them."""

    def __init__(self, progress=print):
        self.progress = progress
        self._runs: dict[tuple, list[PipelineRun]] = {}

    def runs(self, setup: PipelineSetup, scenario: Scenario) -> list[PipelineRun]:
        key = (scenario.name, scenario.key(setup))
        if key not in self._runs:
            started = time.process_time()
            self._runs[key] = serve(setup, scenario)
            self.progress(f"{scenario.name} ({label(scenario.name, setup)}): "
                          f"{time.process_time() - started:.1f} s of CPU")
        return self._runs[key]

    def summary(self, setup: PipelineSetup) -> pd.DataFrame:
        return pd.DataFrame([_row(setup, s, self.runs(setup, s)) for s in SCENARIOS])


def _row(setup: PipelineSetup, scenario: Scenario, runs: list[PipelineRun]) -> dict:
    bubbles = np.concatenate([r.request_bubble_s for r in runs])
    makespan = max(r.makespan_s for r in runs)
    stage_s = sum(len(r.stage_busy_s) for r in runs) * makespan
    its = [it for r in runs for it in r.metrics.iterations]
    return {"scenario": scenario.name, "scheduler": scenario.scheduler,
            "tp": setup.tp, "pp": setup.pp if scenario.pipelined else 1,
            "replicas": len(runs), "batch": setup.batch if scenario.pipelined
            else setup.tp_only_batch, "largest_batch": largest_batch(setup, scenario.pipelined),
            "requests": len(bubbles), "micro_batches": sum(r.num_micro_batches for r in runs),
            "makespan_s": makespan, "median_bubble_s": float(np.median(bubbles)),
            "p90_bubble_s": float(np.percentile(bubbles, 90)),
            "bubble_share": 1 - sum(sum(r.stage_busy_s) for r in runs) / stage_s,
            # What a micro-batch held: how often a prompt's tokens, how many decodes.
            "prefill_share": float(np.mean([it.num_prefill_tokens > 0 for it in its])),
            "decodes_per_micro_batch": float(np.mean([it.num_decode_tokens for it in its]))}


def headline(summary: pd.DataFrame) -> dict[str, float]:
    by = summary.set_index("scenario")
    return {name: float(by.at[top, column] / by.at[bottom, column])
            for name, top, bottom, column, _ in HEADLINE}


def sensitivity(setup: PipelineSetup, runner: Runner, flips=FLIPS) -> pd.DataFrame:
    """The headline at the paper's setup, then with each flip alone."""
    rows = [("none: the paper's setup", "", "", setup)]
    rows += [(f.label, f.knob, str(f.value), f.applied(setup)) for f in flips]
    return pd.DataFrame([{"change": change, "knob": knob, "value": value,
                          "within_device": within_device(s), **headline(runner.summary(s))}
                         for change, knob, value, s in rows])


def fig12(setup: PipelineSetup | None = None, progress=print, flips=FLIPS
          ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, list[PipelineRun]]]:
    """(summary, sensitivity, the paper's setup's runs by scenario)."""
    setup = setup or PipelineSetup()
    runner = Runner(progress)
    summary = runner.summary(setup)
    table = sensitivity(setup, runner, flips)
    return summary, table, {s.name: runner.runs(setup, s) for s in SCENARIOS}


def markdown(summary: pd.DataFrame, table: pd.DataFrame) -> str:
    """The tables as the docs quote them (tests hold the docs to this)."""
    ratios = headline(summary)
    paper = {name: PAPER[key] for name, *_, key in HEADLINE}
    head = ["| | ours | paper |", "|---|---|---|"]
    words = {"median_bubble_ratio": ("median bubble per request", "Orca TP+PP / SARATHI TP+PP"),
             "end_to_end_orca_tp_pp": ("time to complete all", "Orca TP+PP / SARATHI TP+PP"),
             "end_to_end_tp_only": ("time to complete all", "Orca TP-only / SARATHI TP+PP"),
             "tp_only_over_orca_tp_pp": ("time to complete all", "Orca TP+PP / Orca TP-only")}
    head += [f"| {words[n][0]}, {words[n][1]} | {ratios[n]:.2f}x | {paper[n]}x |" for n in ratios]
    short = {"median_bubble_ratio": "median bubble"}
    flips = ["| change | within the device | " + " | ".join(
                 f"{short.get(n, 'all done')}, {words[n][1]} (paper {paper[n]}x)" for n in ratios)
             + " |", "|---|---|" + "---|" * len(ratios)]
    flips += [f"| {r.change} | {'yes' if r.within_device else 'no: what-if'} | "
              + " | ".join(f"{getattr(r, n):.2f}x" for n in ratios) + " |"
              for r in table.itertuples()]
    return "\n".join(head) + "\n\n" + "\n".join(flips)


def write(setup: PipelineSetup, summary: pd.DataFrame, table: pd.DataFrame,
          runs: dict[str, list[PipelineRun]], out: output_files.Outputs) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = setup.requests
    marks = sorted({max(1, round(n * f)) for f in (0.1, 0.25, 0.5, 0.75, 1.0)})
    quantiles = np.linspace(0, 1, 21)
    rows = []
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, group in runs.items():
        # Seconds from the first arrival until m requests have finished, over every replica.
        done = np.sort([r.finish for run in group for r in run.metrics.requests])
        first = min(r.arrival for run in group for r in run.metrics.requests)
        bubbles = np.sort(np.concatenate([run.request_bubble_s for run in group]))
        rows += [{"scenario": name, "kind": "bubble_quantile", "x": q, "value": float(v)}
                 for q, v in zip(quantiles, np.quantile(bubbles, quantiles))]
        rows += [{"scenario": name, "kind": "time_to_complete_s", "x": m,
                  "value": float(done[m - 1] - first)} for m in marks]
        if name != "orca_tp_only":  # TP alone has no pipeline, so no pipeline bubble
            left.plot(bubbles, np.arange(1, len(bubbles) + 1) / len(bubbles),
                      label=label(name, setup))
        right.plot(np.arange(1, len(done) + 1), done - first, label=label(name, setup))
    out.add(FILES[0], pd.DataFrame(rows).to_csv(index=False, float_format="%.5g"))
    out.add(FILES[1], summary.to_csv(index=False, float_format="%.5g"))
    out.add(FILES[2], table.to_csv(index=False, float_format="%.5g"))
    ratios = headline(summary)
    left.set(xlabel="pipeline bubble time per request (stage-seconds)", ylabel="CDF of requests",
             title="(a) bubble time per request")
    left.text(0.97, 0.05, f"median: {ratios['median_bubble_ratio']:.2f}x lower\n"
              f"(paper {PAPER['median_bubble_ratio']}x)", transform=left.transAxes,
              ha="right", va="bottom", fontsize=8)
    right.set(xlabel="requests completed", ylabel="time (s)", title="(b) time to complete N")
    # Below the legend, where the curves leave room (they rise to the right).
    right.text(0.03, 0.75, "time to complete all, ours (paper):\n"
               "Orca TP+PP / SARATHI  {:.2f}x ({}x)\nTP-only / SARATHI  {:.2f}x ({}x)\n"
               "Orca TP+PP / TP-only  {:.2f}x ({}x)".format(
                   ratios["end_to_end_orca_tp_pp"], PAPER["end_to_end_ratio"],
                   ratios["end_to_end_tp_only"], PAPER["tp_only_ratio"],
                   ratios["tp_only_over_orca_tp_pp"], PAPER["tp_only_over_orca"]),
               transform=right.transAxes, ha="left", va="top", fontsize=8,
               bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"})
    for ax in (left, right):
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Fig. 12, simulated: GPT-3 on {setup.tp * setup.pp} A100s (roofline), "
                 f"{n} requests, Zipf({setup.theta}) {setup.min_tokens}-{setup.max_tokens} tokens, "
                 f"P:D {setup.pd_ratio:g}, chunk {setup.chunk}, batch {setup.batch} (TP+PP) / "
                 f"{setup.tp_only_batch} (TP-only)", fontsize=9)
    fig.tight_layout()
    figure = io.BytesIO()
    fig.savefig(figure, format="png", dpi=90)
    plt.close(fig)
    out.add(FILES[3], figure.getvalue())
    out.write()


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("sim_pipeline", __doc__)
    cli_args.shared(parser, smoke="300 requests instead of 10,000",
                    out="default docs/sim (smoke: ./sim_pipeline_smoke)",
                    force="replace tables of another request count in OUT")
    parser.add_argument("--requests", type=positive_int)
    args = parser.parse_args(argv)
    out = args.out or (Path("sim_pipeline_smoke") if args.smoke else REPO_ROOT / "docs" / "sim")
    setup = PipelineSetup(requests=args.requests or (300 if args.smoke else 10_000))
    if refused := requests_refused(setup.requests):  # lengths only: no token lists
        parser.error(refused)
    # The code's commit: the claims row read from these tables says what produced them.
    commit = provenance.commits([code_commit.source_commit()[0]])
    outputs = output_files.Outputs(out, dict.fromkeys(FILES, provenance.Provenance(
        "simulated A100 (pipeline)", f"{setup.requests} requests", commit=commit,
        writer="python -m sarathi_lab.measure sim_pipeline")), given=f"--out={out}",
        force=args.force, how="--force replaces them; --out DIR writes elsewhere")
    try:
        outputs.check()
        summary, table, runs = fig12(setup)
        write(setup, summary, table, runs, outputs)
    except output_files.OutputRefused as e:
        parser.error(str(e))
    ratios = headline(summary)
    print(f"median bubble per request: orca / sarathi = {ratios['median_bubble_ratio']:.2f}x "
          f"(paper {PAPER['median_bubble_ratio']}x); time to complete all: "
          f"{ratios['end_to_end_orca_tp_pp']:.2f}x (paper {PAPER['end_to_end_ratio']}x); "
          f"wrote {out}")
    # As the committed tables read back, which the docs quote.
    print(markdown(*(pd.read_csv(out / name) for name in FILES[1:3])))
