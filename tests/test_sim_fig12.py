"""SARATHI Fig. 12 as simulated (measure/sim_check/sim_pipeline.py): the paper's setup as the
defaults, each micro-batch's tokens taken as it leaves the last stage (worked by hand on a toy
pipeline), best-case Orca's one whole prompt a micro-batch, the TP-only scenario, and the committed
tables and the docs that quote them as the code gives them."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sarathi_lab import output_files, provenance
from sarathi_lab.analysis.paper_results.pipeline_bubbles import PAPER
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.engine.sequence import Sequence
from sarathi_lab.measure.sim_check import sim_pipeline
from sarathi_lab.measure.sim_check.pipeline_setup import FLIPS, PipelineSetup
from sarathi_lab.sim.parallel import StageTimes
from sarathi_lab.sim.pipeline_run import serve_pipeline

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "sim"
QUIET = {"progress": lambda _: None}


def test_the_defaults_are_the_papers_setup():
    s = PipelineSetup()
    assert (s.requests, s.min_tokens, s.max_tokens, s.theta, s.pd_ratio) == (10_000, 1024, 4096, 0.4, 10.0)
    assert (s.tp, s.pp, s.replicas, s.chunk) == (8, 8, 8, 256)
    assert (s.batch, s.tp_only_batch) == (27, 11)   # §5.3: the largest batch that fits
    assert (s.chunk_align, s.collect, s.stage0_host, s.orca_prompts) == ("none", "as_leaves", True, 1)
    # The paper's batches fit the A100's cache with Orca's reservations; 32 a micro-batch does not.
    assert sim_pipeline.within_device(s)
    assert not sim_pipeline.within_device(PipelineSetup(batch=32))
    # Every flip moves one knob off its default.
    assert all(getattr(s, f.knob) != f.value for f in FLIPS)
    assert len({f.knob for f in FLIPS}) == len(FLIPS)


@pytest.mark.parametrize("knob, value, message", [
    ("batch", 0, "must be an integer >= 1"), ("chunk_align", "auto", "allowed values are none, tile"),
    ("collect", "eager", "allowed values are as_leaves, when_full"), ("stage0_host", 1, "must be true or false"),
    ("orca_prompts", 0, "must be an integer >= 1"), ("theta", float("nan"), "must be a finite number > 0")])
def test_a_bad_knob_is_refused_in_one_line_naming_it(knob, value, message):
    with pytest.raises(ConfigError, match=rf"^sim_pipeline\.{knob}={re.escape(repr(value))} is invalid: {message}$"):
        PipelineSetup(**{knob: value})


class ThreeStages:
    """Three stages, each one second per token of the micro-batch; nothing else costs."""
    stages = 3

    def times(self, prefills, decodes, num_sampled) -> StageTimes:
        return StageTimes(stage_s=float(sum(c for c, _ in prefills) + len(decodes)), last_extra_s=0.0, p2p_s=0.0)


def toy(collect_as_leaves: bool):
    # A (1 prompt token, 2 out), B (1, 2), C (4, 1), D (1, 1); one whole prompt a micro-batch.
    sched = make_scheduler("orca", BlockManager(64, 16), {"max_prompts": 1}, max_batch_size=3, chunk_size=4,
                           max_model_len=64)
    return serve_pipeline(sched, ThreeStages(), [(1, 2), (1, 2), (4, 1), (1, 1)],
                          collect_as_leaves=collect_as_leaves)


def riders(run) -> list[tuple[int, ...]]:
    return [(*it.prefill_request_ids, *it.decode_request_ids) for it in run.metrics.iterations]


def test_each_micro_batch_is_collected_as_it_leaves_the_last_stage():
    # A on stage 0 [0, 1], B [1, 2], C [2, 6]; A leaves the last stage at 3, B at 4, C at 14. When stage 0
    # frees at 6, A's and B's tokens are taken first, so both decodes ride with D's prompt in one
    # micro-batch: stage 0 [6, 9], stage 1 [10, 13] (after C), stage 2 [14, 17].
    run = toy(collect_as_leaves=True)
    assert riders(run) == [(0,), (1,), (2,), (3, 0, 1)]
    assert run.stage_start_s[:, 3].tolist() == [6.0, 10.0, 14.0]
    assert {r.request_id: r.finish for r in run.metrics.requests} == {0: 17.0, 1: 17.0, 2: 14.0, 3: 17.0}
    assert run.metrics.requests[1].token_times == [6.0, 17.0]


def test_collected_only_when_full_a_micro_batch_that_left_holds_its_requests_out():
    # The same requests: at 6 the pipeline is full (3 in flight), so only A's token is taken; B's micro-batch
    # has left but stays in flight, so A's decode rides with D's prompt without B [6, 8]; B's token is taken
    # at 8 (full again) and its decode goes alone [8, 9]: five micro-batches where four did.
    run = toy(collect_as_leaves=False)
    assert riders(run) == [(0,), (1,), (2,), (3, 0), (1,)]
    assert {r.request_id: r.finish for r in run.metrics.requests} == {0: 16.0, 1: 17.0, 2: 14.0, 3: 16.0}
    assert run.metrics.requests[1].token_times == [8.0, 17.0]


def test_best_case_orca_takes_one_whole_prompt_a_micro_batch():
    def composed(max_prompts):
        sched = make_scheduler("orca", BlockManager(64, 16), {"max_prompts": max_prompts}, max_batch_size=4,
                               chunk_size=4, max_model_len=64)
        for i in range(3):
            sched.add(Sequence(i, [1] * 5, 2))
        return [c.num_tokens for c in sched.schedule().prefills]

    assert composed(1) == [5]             # one whole prompt, never a chunk of one
    assert composed(None) == [5, 5, 5]    # Orca's own: every free slot's prompt
    # In the experiment: every Orca micro-batch holds at most one prompt, whole; with every free slot's,
    # some hold several.
    setup = PipelineSetup(requests=40)
    orca_tp_pp, _, orca_tp_only = sim_pipeline.SCENARIOS
    (run,) = sim_pipeline.serve(setup, orca_tp_pp)
    prompts = [p for p, _ in sim_pipeline.zipf_lengths(40, 1024, 4096, 0.4, 10.0, 0)]
    assert max(it.num_prefill_requests for it in run.metrics.iterations) == 1
    assert all(chunk == prompts[rid] for it in run.metrics.iterations
               for rid, chunk in zip(it.prefill_request_ids, it.prefill_chunk_tokens))
    assert max(it.num_prefill_requests for r in sim_pipeline.serve(setup, orca_tp_only)
               for it in r.metrics.iterations) == 1
    (greedy,) = sim_pipeline.serve(PipelineSetup(requests=40, orca_prompts=None), orca_tp_pp)
    assert max(it.num_prefill_requests for it in greedy.metrics.iterations) > 1


def test_the_tp_only_scenario_runs_8_replicas_of_tp8_at_batch_11():
    summary, table, runs = sim_pipeline.fig12(PipelineSetup(requests=80), flips=(), **QUIET)
    row = summary.set_index("scenario").loc["orca_tp_only"]
    assert (row.tp, row.pp, row.replicas, row.batch, row.requests) == (8, 1, 8, 11, 80)
    assert len(runs["orca_tp_only"]) == 8 and all(len(r.stage_busy_s) == 1 for r in runs["orca_tp_only"])
    # Round robin: each replica serves every 8th request.
    assert [r.metrics.summary()["num_requests"] for r in runs["orca_tp_only"]] == [10] * 8
    assert row.makespan_s == max(r.makespan_s for r in runs["orca_tp_only"])
    assert set(sim_pipeline.headline(summary)) == {name for name, *_ in sim_pipeline.HEADLINE}
    assert list(table.change) == ["none: the paper's setup"]


def _committed() -> tuple[pd.DataFrame, pd.DataFrame]:
    return (pd.read_csv(DOCS / "pipeline_summary.csv"), pd.read_csv(DOCS / "pipeline_sensitivity.csv"))


def test_the_committed_tables_agree_and_the_docs_quote_them():
    summary, table = _committed()
    assert int(summary.requests.iloc[0]) == PipelineSetup().requests
    default = table.iloc[0]
    assert default.change == "none: the paper's setup" and bool(default.within_device)
    for name, value in sim_pipeline.headline(summary).items():
        assert default[name] == pytest.approx(value, rel=1e-3)
    assert list(table.knob.iloc[1:]) == [f.knob for f in FLIPS]
    # The docs carry the tables as the code renders the committed ones; RESULTS.md's Fig. 12 row
    # (a generated block of the claims table) each headline ratio against the paper's.
    readme = (ROOT / "docs" / "sim" / "README.md").read_text()
    for quoted in sim_pipeline.markdown(summary, table).split("\n\n"):
        assert quoted in readme
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    start = text.index("<!-- generated: claims pipeline_bubbles -->")
    block = text[start:text.index("<!-- /generated -->", start)]
    row = next(line for line in block.splitlines() if "pipeline_summary.csv" in line)
    for name, value in sim_pipeline.headline(summary).items():
        assert f"{value:.2f}x" in row, (name, row)
    assert f"{PAPER['tp_only_ratio']}x" in row and f"{PAPER['tp_only_over_orca']}x" in row


@pytest.mark.slow
def test_the_committed_tables_are_what_the_command_gives_now(tmp_path):
    # The whole experiment at 10,000 requests (minutes): the committed tables, byte for byte.
    setup = PipelineSetup()
    summary, table, runs = sim_pipeline.fig12(setup, **QUIET)
    outputs = output_files.Outputs(tmp_path, dict.fromkeys(sim_pipeline.FILES, provenance.Provenance(
        "simulated A100 (pipeline)", f"{setup.requests} requests")))
    sim_pipeline.write(setup, summary, table, runs, outputs)
    for name in sim_pipeline.FILES[:3]:
        assert (tmp_path / name).read_bytes() == (DOCS / name).read_bytes(), name
    assert np.isfinite(summary.median_bubble_s).all()
