"""Pipeline and tensor parallelism in the simulator: bubble accounting by hand on a two-stage
pipeline served by the engine's loop, the all-reduce term by hand, identical runs per seed, and
Fig. 12's direction."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from transformers import AutoConfig

from sarathi_lab.config import ConfigError
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.scheduler import make_scheduler
from sarathi_lab.measure.sim_check.pipeline_setup import PipelineSetup
from sarathi_lab.measure.sim_check.sim_pipeline import GPT3, fig12, stage_costs, zipf_lengths
from sarathi_lab.sim.parallel import StageTimes
from sarathi_lab.sim.pipeline_run import PipelineRun, serve_pipeline
from sarathi_lab.sim.sharding import Parallelism, shard_config


class OneSecondPerToken:
    """Two stages, each one second per token of the micro-batch; nothing else costs."""
    stages = 2

    def times(self, prefills, decodes, num_sampled) -> StageTimes:
        return StageTimes(stage_s=float(sum(c for c, _ in prefills) + len(decodes)), last_extra_s=0.0, p2p_s=0.0)


def two_stages(lengths, arrivals=None) -> PipelineRun:
    sched = make_scheduler("orca", BlockManager(64, 16), max_batch_size=1, chunk_size=4, max_model_len=64)
    return serve_pipeline(sched, OneSecondPerToken(), lengths, arrivals)


def test_a_short_micro_batch_before_a_long_one_leaves_the_second_stage_idle():
    # A (1 token) then B (3 tokens): stage 0 runs A [0, 1], B [1, 4]; stage 1 A [1, 2], B [4, 7].
    # Stage 1 idles [0, 1] waiting for A (the fill) and [2, 4] waiting for B. The driver collects A's
    # token only once stage 0 has taken B, at 4, as the engine's loop does with room in the pipeline.
    res = two_stages([(1, 1), (3, 1)])
    assert res.stage_start_s.tolist() == [[0.0, 1.0], [1.0, 4.0]]
    assert res.stage_end_s.tolist() == [[1.0, 4.0], [2.0, 7.0]]
    assert res.micro_bubble_s.tolist() == [1.0, 2.0]
    assert res.request_bubble_s.tolist() == [1.0, 2.0]
    assert [r.finish for r in res.metrics.requests] == [4.0, 7.0]
    assert res.stage_busy_s == [4.0, 4.0] and res.makespan_s == 7.0


def test_a_request_alone_waits_for_its_own_token_at_every_stage():
    # One request, prompt 1, 3 tokens out: each micro-batch must leave stage 1 before the next
    # enters stage 0. Busy [0,1],[2,3],[4,5] on stage 0 and [1,2],[3,4],[5,6] on stage 1: every
    # idle second while the request is unfinished is bubble, 5 s (stage 0 idles [5, 6] with
    # nothing left to schedule).
    res = two_stages([(1, 3)])
    assert res.micro_bubble_s.tolist() == [1.0, 2.0, 2.0]
    assert res.request_bubble_s.tolist() == [5.0]
    assert res.metrics.requests[0].token_times == [2.0, 4.0, 6.0]


def test_waiting_for_an_arrival_is_no_bubble():
    res = two_stages([(1, 1), (1, 1)], arrivals=[0.0, 10.0])
    # Each request alone: stage 1 waits one second for it (the fill), nothing more.
    assert res.request_bubble_s.tolist() == [1.0, 1.0]
    assert res.stage_start_s[0].tolist() == [0.0, 10.0]


class FourStages:
    """Four stages, one second a micro-batch and a tenth a token: chunks and decodes both cost."""
    stages = 4

    def times(self, prefills, decodes, num_sampled) -> StageTimes:
        tokens = sum(c for c, _ in prefills) + len(decodes)
        return StageTimes(stage_s=1.0 + 0.1 * tokens, last_extra_s=0.0, p2p_s=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_sarathi_micro_batch_carries_a_chunk_while_a_prompt_waits_and_the_pipeline_has_room(seed):
    # B - 1 decodes and one chunk a micro-batch (P:D = C / (B - 1) = 8 / 3): outputs collected as
    # they leave merge micro-batches, and the oldest B requests not in flight all decoding must not
    # send one out without the waiting prompt while the pipeline holds fewer than B a micro-batch.
    batch, cost = 4, FourStages()
    sched = make_scheduler("sarathi", BlockManager(4096, 16), {"chunk_align": "none"},
                           max_batch_size=batch, chunk_size=8, max_model_len=64)
    run = serve_pipeline(sched, cost, zipf_lengths(200, 16, 64, 0.4, 3.0, seed), collect_as_leaves=True)
    reqs, checked = run.metrics.requests, 0
    for it in run.metrics.iterations:
        # Held when it was scheduled: admitted by an earlier micro-batch, not yet finished.
        held = sum(r.first_scheduled < it.start < r.finish for r in reqs)
        if any(r.first_scheduled >= it.start for r in reqs) and held < batch * cost.stages:
            checked += 1
            assert it.num_prefill_tokens > 0, f"micro-batch {it.iteration}: {held} held, no chunk"
    assert checked > len(run.metrics.iterations) * 0.8


def test_tensor_parallel_shard_and_all_reduce_by_hand():
    gpt3 = AutoConfig.from_pretrained(GPT3)
    par = Parallelism(tp=8, pp=8)
    shard = shard_config(gpt3, par)
    assert ((shard.num_attention_heads, shard.head_dim, shard.intermediate_size, shard.num_hidden_layers)
            == (12, 128, 4096, 12))
    cost = stage_costs(PipelineSetup(), 8)
    tokens = 256
    one = 10e-6 + 2 * 7 / 8 * tokens * 12288 * 2 / 240e9
    assert cost.stage.all_reduce(tokens * 12288 * 2) == pytest.approx(one, rel=1e-12)
    t = cost.times([(tokens, tokens)], [], 0)
    bare = cost.stage.shard.iteration_cost([(tokens, tokens)], [], 0)
    assert t.stage_s == pytest.approx(bare.forward_s - bare.ops["lm_head"] + 2 * 12 * one, rel=1e-12)
    assert t.p2p_s == pytest.approx(5e-6 + tokens * 12288 * 2 / 8 / 25e9, rel=1e-12)
    # The stage-0 host step the A100's cost model prices (a100.yaml: 1.5 ms + 0.5 us a token).
    assert t.host_s == pytest.approx(1.5e-3 + 0.5e-6 * tokens, rel=1e-12)
    assert stage_costs(PipelineSetup(stage0_host=False), 8).times([(tokens, tokens)], [], 0) == replace(
        t, host_s=0.0)
    # 96 layers over 7 stages as the engine splits them: 14 on the first five, 13 on the last two.
    assert shard_config(gpt3, Parallelism(tp=8, pp=7)).num_hidden_layers == 14
    with pytest.raises(ConfigError, match=r"^sim_tp=7 is invalid for model='': its 96 attention heads"):
        shard_config(gpt3, Parallelism(tp=7, pp=8))


@pytest.mark.parametrize("key, value, allowed", [
    ("allreduce_bandwidth", float("nan"), "> 0"), ("p2p_bandwidth", -25e9, "> 0"), ("p2p_bandwidth", 0, "> 0"),
    ("allreduce_latency_s", -1, ">= 0"), ("p2p_latency_s", float("inf"), ">= 0"), ("tp", True, None)])
def test_bad_link_figures_fail_with_one_line(key, value, allowed):
    # A NaN bandwidth made run() loop forever; a negative latency gave negative makespans.
    message = (f"must be a finite number {allowed}" if allowed else "must be an integer >= 1")
    with pytest.raises(ConfigError, match=rf"^sim\.parallel\.{key}={value!r} is invalid: {message}$"):
        Parallelism(**{key: value})
    assert Parallelism(allreduce_latency_s=0, p2p_latency_s=0).p2p_latency_s == 0


def test_same_seed_gives_identical_runs_and_sarathi_has_fewer_bubbles():
    setup = PipelineSetup(requests=60, seed=3)
    a, _, results = fig12(setup, progress=lambda _: None, flips=())
    b, _, _ = fig12(setup, progress=lambda _: None, flips=())
    assert a.equals(b)
    (orca,), (sarathi,) = results["orca_tp_pp"], results["sarathi_tp_pp"]
    assert (orca.metrics.summary()["num_requests"], sarathi.metrics.summary()["num_requests"]) == (60, 60)
    assert np.median(sarathi.request_bubble_s) < np.median(orca.request_bubble_s)


def test_zipf_lengths_stay_in_range_at_the_pd_ratio():
    lengths = zipf_lengths(500, 1024, 4096, 0.4, 10.0, seed=0)
    totals = np.array([p + d for p, d in lengths])
    assert totals.min() >= 1024 and totals.max() <= 4096
    assert np.median([p / d for p, d in lengths]) == pytest.approx(10, rel=0.05)
    assert np.mean(totals < 2560) > 0.5   # the weights favour the short end


@pytest.mark.e2e
def test_the_pipeline_command_writes_its_table_and_figure(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "sim_pipeline", "--smoke", "--requests",
                           "40", "--out", str(tmp_path)], check=False, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "paper 6.29x" in done.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {"pipeline_summary.csv", "pipeline_bubbles.csv",
                                                    "pipeline_bubbles.png"}
