"""Each GPU paper step's grid holds the points its claims read, and no point none reads (apart from
the few a product grid brings, named here); each claim is judged on hand-made runs at exactly the
step's jobs, as the suite launches them; and the plan says whether the steps fit their leases."""
from __future__ import annotations

import pandas as pd
import pytest

from sarathi_lab.analysis import derive, paper, registry
from sarathi_lab.analysis.paper_results import chunk_batch, chunk_overhead, per_token_cost
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.gpu import budget, queue
from sarathi_lab.measure.gpu.plan import BY_NAME, STEPS, format_plan
from tests.results_frames import Frames

CHECK = {r.name: r.claims for r in registry.RESULTS}
ALIGN = derive.CHUNK_ALIGN

# What each step's claims read (analysis/paper_results/<name>.py), by swept key, from the paper's
# numbers where the claim takes them from there. A key's values must hold these; a value beyond them
# must be in EXTRA with why.
NEEDS: dict[str, dict[str, set[str]]] = {
    # decode over prefill at the batches the paper gives it for; one length, the paper's.
    "paper.per_token_cost": {"batch_size": {str(b) for b in per_token_cost.DECODE_OVER_PREFILL},
                             "seq_len": {"1024"}},
    # every length of Fig. 8 at batches the A6000 held there, tile-aligned (the verdict's).
    "paper.decode_speedup": {"seq_len": {str(n) for n in paper.LARGEST_BATCH},
                             "batch_size": {"2", "6", "12", "18"}, ALIGN: {"tile"}},
    # the peak: P:D on both sides of C / (B - 1) = 15; sarathi over static, tile-aligned.
    "paper.pd_ratio": {"pd_ratio": {"7", "14", "28"}, "scheduler": {"static", "sarathi"},
                       "++" + ALIGN: {"tile"}},
    # chunk 64's slowdowns and the 256 / 512 prefill bounds, at each length.
    "paper.chunk_overhead": {"chunk": {"64", *(str(c) for c in chunk_overhead.PREFILL_SLOWDOWN_BOUND)},
                             "seq_len": {"1024", "3072"}},
    # chunk 64 about the baseline, 128 gains, 256 (aligned) above 320 (fixed).
    "paper.chunk_batch": {"chunk": {str(c) for c in (*chunk_batch.CHUNK_BATCH_GAIN,
                                                     *chunk_batch.CHUNK_BATCH_ABOVE)},
                          "++" + ALIGN: {"none", "auto"}, "scheduler": {"static", "sarathi"}},
    # SARATHI (tile-aligned) over Orca's best (staggered) and worst (lock step), on the baseline.
    "paper.orca_compare": {"workload.stagger": {"0", "18"}, "scheduler": {"static", "orca", "sarathi"},
                           "++" + ALIGN: {"tile"}},
    # sarathi_serve's P99 TBT against vllm's and orca's at every load.
    "paper.scheduler_latency": {"scheduler": {"sarathi_serve", "vllm", "orca"},
                                "workload.qps": {"2", "4"}},
    # sarathi_serve's capacity over vllm's, strict SLO.
    "paper.capacity.strict": {"scheduler": {"sarathi_serve", "vllm"}, "slo": {"strict"}},
}
# Points no claim reads that a product grid cannot leave out, and why they are kept.
EXTRA: dict[str, dict[str, set[str]]] = {}
# Repeats: every claim point three times (its spread).
SEEDS = {"0", "1", "2"}


def _axes(step) -> dict[str, list[str]]:
    return {key: value.split(",") for key, value in (o.split("=", 1) for o in step.overrides)}


def _paper_steps():
    return [s for s in STEPS if s.group == "paper" and s.arg != "tile_quantization"]


def test_every_paper_step_s_needs_are_declared():
    assert {s.name for s in _paper_steps()} == set(NEEDS)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_each_gpu_grid_holds_what_its_claims_read_and_nothing_more(name):
    axes = _axes(BY_NAME[name])
    for key, needed in NEEDS[name].items():
        swept = set(axes.get(key, []))
        assert needed <= swept, f"{name}: {key}={','.join(sorted(swept))} lacks {sorted(needed - swept)}"
        extra = swept - needed - EXTRA.get(name, {}).get(key, set())
        assert not extra, f"{name}: {key} sweeps {sorted(extra)}, which no claim reads"
    seeds = set(axes.get("seed", [])) or {"search"}
    assert seeds in (SEEDS, {"search"}), name  # capacity's spread is its search's bracket


def test_tile_quantization_times_the_paper_s_step_and_its_tile_pairs():
    axes = _axes(BY_NAME["paper.tile_quantization"])
    assert axes["seed"] == sorted(SEEDS) and int(axes["seq_len"][0]) > 2 * paper.TILE


def _jobs(name: str) -> pd.DataFrame:
    """The step's jobs as the suite launches them, one row each, keys as the runs record them."""
    rows = []
    for job in queue.launched_jobs(BY_NAME[name]):
        row = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in job}
        rows.append({k: _number(v) for k, v in row.items()})
    return pd.DataFrame(rows)


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _judged(rows: list[dict]) -> None:
    for row in rows:
        assert row["holds"] not in ("n/a", ""), row
        assert "not in these runs" not in row["ours"] and "not both" not in row["ours"], row


def test_per_token_cost_claims_are_judged_on_its_gpu_jobs():
    ops = []
    for job in _jobs("paper.per_token_cost").itertuples():
        for phase, per_token in (("prefill", 0.01), ("decode", 2.0 / job.batch_size)):
            tokens = job.batch_size * job.seq_len if phase == "prefill" else job.batch_size
            ops.append({"phase": phase, "batch_size": job.batch_size, "seq_len": job.seq_len,
                        "seed": job.seed, "op": "total", "tokens": tokens, "ms": per_token * tokens,
                        "ms_per_token": per_token})
    sweep = pd.DataFrame({"op": "total", "tokens": [128, 256, 384, 512, 1024],
                          "ms": [4.0, 6.0, 8.0, 10.0, 20.0]})
    _judged(CHECK["per_token_cost"](Frames({("per_token_cost", "ops"): pd.DataFrame(ops),
                                             ("tile_quantization", "sweep"): sweep})))


def test_decode_speedup_claim_is_judged_on_its_gpu_jobs():
    rows = [{"iteration": it, "ms": ms + job.seed * 0.01, "seq_len": job.seq_len,
             "batch_size": job.batch_size, "chunk": job.chunk, "seed": job.seed,
             "chunk_align": job[ALIGN]}
            for _, job in _jobs("paper.decode_speedup").iterrows()
            for it, ms in (("decode_only", 20.0), ("chunk_alone", 50.0),
                           ("hybrid", 50.0 + 2.0 * (job.batch_size - 1)))]
    (row,) = CHECK["decode_speedup"](Frames({("decode_speedup", "piggyback"): pd.DataFrame(rows)}))
    _judged([row])
    assert row["ours / paper"].count("length") == len(paper.LARGEST_BATCH)


def _served(name: str, throughput) -> pd.DataFrame:
    jobs = _jobs(name)
    return jobs.assign(total_throughput_tok_s=[throughput(j) for _, j in jobs.iterrows()],
                       run_dir=[f"run{i}" for i in range(len(jobs))])


def test_pd_ratio_claims_are_judged_on_its_gpu_jobs():
    def throughput(job):
        gain = 1.25 if job.pd_ratio == 14 else 1.12
        return 100.0 * (gain if job.scheduler == "sarathi" else 1.0) + job.seed

    _judged(CHECK["pd_ratio"](Frames({("pd_ratio", "summary"): _served("paper.pd_ratio", throughput)})))


def test_chunk_batch_claims_are_judged_on_its_gpu_jobs():
    gains = {64: 1.0, 128: 1.15, 256: 1.2, 320: 1.1}
    summary = _served("paper.chunk_batch", lambda j: 100.0 * (
        gains[j.chunk] if j.scheduler == "sarathi" else 1.0) + j.seed)
    # The setup sets the workload, and each run records the alignment "auto" settled on: tiles
    # where chunk + B - 1 fills one (analysis reads the runs' recorded keys).
    summary = summary.assign(seq_len=1024, batch_size=18, pd_ratio=15, chunk_align=[
        "none" if a == "none" or c + 17 < paper.TILE else "tile"
        for a, c in zip(summary[ALIGN], summary.chunk)])
    _judged(CHECK["chunk_batch"](Frames({("chunk_batch", "summary"): summary})))


def test_chunk_overhead_claims_are_judged_on_its_gpu_jobs():
    jobs = _jobs("paper.chunk_overhead")
    slowdown = jobs.chunk.map({64: 3.0, 256: 1.15, 512: 1.05})
    summary = jobs.assign(attention_slowdown=slowdown, prefill_slowdown=slowdown,
                          end_to_end_slowdown=slowdown, kv_reread_ratio=4.0)
    _judged(CHECK["chunk_overhead"](Frames({("chunk_overhead", "summary"): summary})))


def test_orca_compare_claim_is_judged_on_its_gpu_jobs():
    gains = {"static": 1.0, "orca": 1.1, "sarathi": 1.27}
    summary = _served("paper.orca_compare", lambda j: 100.0 * gains[j.scheduler] + j.seed)
    iterations = pd.DataFrame({"run_dir": summary.run_dir, "num_prefill_tokens": 256,
                               "num_decode_tokens": 17})
    (row,) = CHECK["orca_compare"](Frames({("orca_compare", "summary"): summary,
                                            ("orca_compare", "iterations"): iterations}))
    _judged([row])
    # The fixed chunk, not swept, is not said to have failed.
    assert "left out" not in row["ours"] and "SARATHI (tile-aligned) 1.27x" in row["ours"]


def test_scheduler_latency_claim_is_judged_on_its_gpu_jobs():
    tbt = {"sarathi_serve": 0.03, "vllm": 0.09, "orca": 0.08}
    jobs = _jobs("paper.scheduler_latency")
    summary = jobs.assign(itl_p99_s=jobs.scheduler.map(tbt))
    _judged(CHECK["scheduler_latency"](Frames({("scheduler_latency", "summary"): summary})))


def _planned():
    return queue.measured(list(STEPS), REPO_ROOT / "docs" / "gpu")


def test_the_plan_shows_each_paper_step_s_set_up_share_and_whether_the_steps_fit_their_leases():
    steps, parts = _planned()
    text = format_plan(steps, 9.0, parts)
    assert "share" in text.splitlines()[0]
    for fit in budget.fits(steps):
        assert fit.line() in text
    assert f"set-up under {budget.SETUP_SHARE_MAX:.0%} of each paper step" in text
    # SARATHI's claim steps, not Sarathi-Serve's serving ones.
    names = {s.name for s in budget.claim_steps(steps)}
    assert "paper.decode_speedup" in names and not names & {"paper.scheduler_latency",
                                                            "paper.capacity.strict"}


def test_a_plan_over_its_leases_says_by_how_much():
    fit = budget.Fit("x", budget.LEASE_STEP_MIN + 1.0, 1)
    assert not fit.fits and fit.line().endswith("over by 1.0 min")
    assert budget.Fit("x", budget.LEASE_STEP_MIN, 1).fits


# Today's plan from the kept leases, which a grid may not grow past: a step added or a point put back
# must come with a trim elsewhere (or a lease measuring the steps shorter) to pass.
CLAIM_STEPS_CEILING_MIN, QUEUE_CEILING_MIN = 19.6, 46.1


def test_the_plan_grows_past_no_ceiling():
    claims, queue_ = budget.fits(_planned()[0])
    assert claims.minutes <= CLAIM_STEPS_CEILING_MIN and queue_.minutes <= QUEUE_CEILING_MIN


@pytest.mark.xfail(strict=True, reason="the targets: SARATHI's claim steps in one lease, the whole "
                                       "queue in two, set-up under 10% of each paper step; the plan "
                                       "from the kept leases is over them all (--plan says by how "
                                       "much): on passing, drop this mark")
def test_the_plan_fits_its_targets():
    steps, parts = _planned()
    assert all(fit.fits for fit in budget.fits(steps)) and not budget.setup_over(steps, parts)
