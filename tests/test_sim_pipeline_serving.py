"""Pipeline stages in the simulator's serving path (engine.sim_pp): one stage is the simulator as it
was; two stages on a toy cost model give timelines worked out by hand here; the engine's own loop
drives the simulated pipeline as it drives a real one (the same micro-batches in the same order,
the same requests held out); each GPU holds its stage's layers; the Falcon-180B TP4 x PP2 overlay runs
end to end; bad values are refused in one line naming the key."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.engine.batch import ScheduledBatch
from sarathi_lab.engine.block_manager import BlockManager
from sarathi_lab.engine.clock import VirtualClock
from sarathi_lab.engine.executor import PipelineExecutor, StepOutput
from sarathi_lab.engine.llm_engine import LLMEngine
from sarathi_lab.engine.metrics import Metrics
from sarathi_lab.engine.scheduler import make_scheduler, scheduler_names
from sarathi_lab.engine.sequence import SamplingParams, Sequence
from sarathi_lab.harness.budget import budget_cost_model
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.results import run_source
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.host_features import usable_cores
from sarathi_lab.sim import CostModel
from sarathi_lab.sim.executor import SimulatedExecutor, SimulatedPipelineExecutor
from sarathi_lab.sim.parallel import PipelineCostModel, StageTimes

ROOT = Path(__file__).resolve().parents[1]
OVERLAY = "capacity_sim_falcon180b_tp4pp2"


class SecondPerToken:
    """Two stages, each one second per token of the micro-batch; ``p2p_s`` between them."""
    stages = 2

    def __init__(self, p2p_s: float = 0.0):
        self.p2p_s = p2p_s

    def times(self, prefills, decodes, num_sampled) -> StageTimes:
        return StageTimes(stage_s=float(sum(c for c, _ in prefills) + len(decodes)), last_extra_s=0.0,
                          p2p_s=self.p2p_s)


def toy_run(lengths: list[tuple[int, int]], p2p_s: float = 0.0, batch: int = 1):
    sched = make_scheduler("orca", BlockManager(64, 4), max_batch_size=batch, chunk_size=4, max_model_len=64)
    clock = VirtualClock()
    executor = SimulatedPipelineExecutor(SecondPerToken(p2p_s), clock)
    metrics = Metrics()
    LLMEngine(sched, executor, clock).run([Sequence(i, [1] * p, d) for i, (p, d) in enumerate(lengths)], metrics,
                                          SamplingParams())
    return metrics, executor


def test_a_second_micro_batch_runs_on_stage_0_while_the_first_is_on_stage_1():
    # A (1 prompt token) then B (3): stage 0 runs A [0, 1] and B [1, 4]; A crosses in 0.5 s and runs on
    # stage 1 [1.5, 2.5], B [4.5, 7.5]. The driver (a rank of stage 0) schedules B once stage 0 is free
    # of A, and collects A's token once it has run B's stage 0: at 4.
    metrics, executor = toy_run([(1, 1), (3, 1)], p2p_s=0.5)
    assert executor.stage_spans == [([0.0, 1.5], [1.0, 2.5]), ([1.0, 4.5], [4.0, 7.5])]
    assert [(i.start, i.start + i.duration) for i in metrics.iterations] == [(0.0, 4.0), (1.0, 7.5)]
    assert [r.finish for r in metrics.requests] == [4.0, 7.5]
    assert executor.stage_busy_s == [4.0, 4.0]


def test_a_request_alone_gets_a_token_per_passage_through_both_stages():
    # Prompt 2, 3 tokens: [0, 2] + 0.5 + [2.5, 4.5]; then each decode 1 + 0.5 + 1 = 2.5 s.
    metrics, _ = toy_run([(2, 3)], p2p_s=0.5)
    assert metrics.requests[0].token_times == [4.5, 7.0, 9.5]


@pytest.mark.parametrize("tokens", [1, 5])
def test_two_requests_keep_both_stages_busy_and_finish_in_half_the_serial_time(tokens):
    # One token a micro-batch, a second a stage: A's micro-batches leave at 2, 4, ..., B's at 3, 5, ...
    # (each stage always busy once filled): 2 D + 1 s for D tokens each, where one micro-batch at a
    # time through both stages takes 4 D.
    metrics, executor = toy_run([(1, tokens), (1, tokens)])
    assert [r.token_times for r in metrics.requests] == [[2.0 * k for k in range(1, tokens + 1)],
                                                         [2.0 * k + 1 for k in range(1, tokens + 1)]]
    assert metrics.summary()["makespan_s"] == 2 * tokens + 1
    assert executor.stage_busy_s == [2.0 * tokens] * 2


def test_one_stage_is_the_simulator_as_it_was():
    # tests/test_sim_golden.py's TP2 case, with sim_pp=1 said: the same executor and the same records.
    from sarathi_lab.measure.sim_check.sim_speed import digest, workload

    llm = LLM("llama2-7b", executor="sim", num_kv_blocks=600, sim_device="a100", sim_tp=2, sim_pp=1,
              scheduler="orca", max_batch_size=8)
    assert type(llm.engine.executor) is SimulatedExecutor
    prompts, decodes, arrivals = workload(40, (100, 900), (4, 64), rate_rps=6.0)
    llm.generate(prompts, decodes, arrival_times=arrivals)
    summary = llm.metrics.summary()
    assert (digest(llm.metrics), summary["num_iterations"], summary["makespan_s"]) == \
        ("c34fd674218f9a98", 842, 6.506548852379615)
    assert type(CostModel.for_device("a100", "llama2-7b", pp=1)) is type(CostModel.for_device("a100", "llama2-7b"))


class Deferred(PipelineExecutor):
    """The real engine's pipeline in one process: the single-process model runs a micro-batch when its
    tokens are collected (tests/test_pipeline_loop.py); records what the engine submitted, and the
    requests it held out meanwhile."""

    def __init__(self, inner, depth: int, scheduler):
        self.inner, self.depth, self.scheduler = inner, depth, scheduler
        self.queue: deque[ScheduledBatch] = deque()
        self.log = []

    def start(self, sampling):
        self.inner.start(sampling)

    def submit(self, batch):
        self.log.append(_composition(batch, self.scheduler))
        self.queue.append(batch)

    def collect(self) -> StepOutput:
        return self.inner.execute(self.queue.popleft())

    def drain(self):
        self.queue.clear()


class Logged(SimulatedPipelineExecutor):
    def submit(self, batch):
        self.log.append(_composition(batch, self.scheduler))
        super().submit(batch)


def _composition(batch: ScheduledBatch, scheduler) -> tuple:
    return (tuple((c.seq.seq_id, c.num_tokens) for c in batch.prefills), tuple(s.seq_id for s in batch.decodes),
            tuple(sorted(scheduler.in_flight)))


SETTINGS = {"chunk_size": 8, "max_batch_size": 2, "max_model_len": 64, "num_kv_blocks": 48, "block_size": 4}
PROMPTS = [[7] * 19, [3, 1, 4, 1, 5, 9, 2, 6], [11] * 13, [2] * 3, [5, 6] * 5]
NEW = [4, 7, 3, 6, 5]


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_the_engine_drives_the_simulated_pipeline_as_it_drives_a_real_one(scheduler):
    real = LLM("tiny", scheduler=scheduler, device="cpu", dtype="float32", warmup_iters=0, num_threads=1, **SETTINGS)
    deferred = Deferred(real.engine.executor, 2, real.engine.scheduler)
    real.engine = LLMEngine(real.engine.scheduler, deferred, real.engine.clock)
    real.generate(PROMPTS, NEW, sampling=SamplingParams(ignore_eos=True))
    sim = LLM("tiny", scheduler=scheduler, executor="sim", sim_device="a100", sim_pp=2, **SETTINGS)
    executor = sim.engine.executor
    assert isinstance(executor, SimulatedPipelineExecutor) and executor.depth == 2
    executor.__class__, executor.log, executor.scheduler = Logged, [], sim.engine.scheduler
    sim.generate(PROMPTS, NEW)
    # The same micro-batches in the same order, each submitted with the same requests in flight.
    assert executor.log == deferred.log
    assert any(held for *_, held in executor.log)
    its = sim.metrics.iterations
    assert any(b.start < a.start + a.duration for a, b in itertools.pairwise(its))  # micro-batches overlap


def _micro_batches(llm: LLM) -> list[tuple]:
    return [(i.prefill_request_ids, i.prefill_chunk_tokens, i.decode_request_ids) for i in llm.metrics.iterations]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two cores")
@pytest.mark.parametrize("scheduler", ["sarathi_serve", "vllm"])
def test_the_simulated_pipeline_makes_the_real_two_stage_pipeline_s_micro_batches(scheduler):
    # The real engine over two ranks (gloo, tiny): the same micro-batches, in the order their tokens
    # returned, as the simulated pipeline's.
    settings = {**SETTINGS, "scheduler": scheduler}
    real = LLM("tiny", pipeline_parallel=2, device="cpu", dtype="float32", warmup_iters=0, num_threads=1,
               collective_timeout_s=30, **settings)
    real.generate(PROMPTS, NEW, sampling=SamplingParams(ignore_eos=True))
    sim = LLM("tiny", executor="sim", sim_device="a100", sim_pp=2, **settings)
    sim.generate(PROMPTS, NEW)
    assert _micro_batches(sim) == _micro_batches(real)


def test_each_gpu_holds_its_stage_s_layers_falcon_fits_tp4_x_pp2_on_a100s():
    with pytest.raises(ConfigError, match=r"^sim_device='a100' is invalid for this model: its weights take 83.6 GiB"):
        LLM("falcon-180b", executor="sim", sim_device="a100", sim_tp=4)
    llm = LLM("falcon-180b", executor="sim", sim_device="a100", sim_tp=4, sim_pp=2, max_batch_size=32,
              chunk_size=512)
    # One GPU: 40 of the 80 layers, a quarter of each (qkv 14848 x (3712 + 2 x 128), o 3712 x 14848,
    # gate/up 14848 x 2 x 9898, down 9898 x 14848) and two norms a layer; a quarter of the embedding and of
    # the LM head (16256 x 14848 each); its 2 KV heads of 64 in 40 layers, 20,480 bytes a token.
    h = 14848
    layer = h * (3712 + 256) + 3712 * h + h * 2 * 9898 + 9898 * h + 2 * h
    weights = 2 * (40 * layer + 2 * 16256 * h + h)
    free = 0.9 * 85899345920 - weights
    assert 45.3e9 < weights < 45.4e9
    assert llm.plan.kv_capacity_tokens == pytest.approx(free / 20480, rel=0.01)
    assert llm.plan.kv_capacity_tokens <= free / 20480


def test_an_iteration_of_the_pipeline_is_a_passage_through_both_stages():
    pipe = CostModel.for_device("a100", "falcon-180b", tp=4, pp=2)
    assert isinstance(pipe, PipelineCostModel)
    batch = ([(512, 1024)], [1024] * 32)
    stage = pipe.stage.iteration_cost(*batch, 33)
    head = stage.ops["lm_head"]
    tokens = 512 + 32
    send = 5e-6 + tokens * h_bytes() / 4 / 25e9  # InfiniBand HDR between the two nodes
    assert pipe.times(*batch, 33).p2p_s == pytest.approx(send, rel=1e-12)
    passage = stage.prepare_s + 2 * (stage.forward_s - head) + head + send
    assert pipe.iteration_time_s(*batch, 33) == pytest.approx(passage, rel=1e-12)
    # One stage's cost is half the layers (and their all-reduces) of the TP4 model.
    tp4 = CostModel.for_device("a100", "falcon-180b", tp=4).iteration_cost(*batch, 33)
    assert stage.forward_s - head == pytest.approx((tp4.forward_s - tp4.ops["lm_head"]) / 2, rel=1e-9)


def h_bytes() -> int:
    return 14848 * 2


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "tiny", "sim_pp": 0}, r"^sim_pp=0 is invalid: must be > 0$"),
    ({"model": "tiny", "sim_pp": 5}, (r"^sim_pp=5 is invalid for model='tiny': it has 4 layers, fewer than the "
                                      r"stages; allowed: at most 4$")),
    ({"model": "tiny", "sim_pp": 2, "sim_cost_model": "profile"},
     (r"^sim_pp=2 is invalid with sim_cost_model='profile': a profile times the whole model's layers, not a "
      r"stage's; allowed: 1, or sim_cost_model=calibrated or roofline$")),
])
def test_a_bad_sim_pp_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LLM(executor="sim", sim_device="a100", **kwargs)


def test_sim_pp_off_the_simulator_and_in_a_run_config_is_refused_by_its_full_key():
    with pytest.raises(ConfigError, match=r"^sim_pp=2 is invalid with executor='model': the engine simulates no "
                                          r"pipeline stages; allowed: 1 \(or executor=sim\)$"):
        LLM("tiny", device="cpu", sim_pp=2)
    with pytest.raises(ConfigError, match=r"^pipeline_parallel=2 is invalid with executor='sim': the simulator "
                                          r"splits no model into stages; allowed: 1 \(or executor=model\)$"):
        LLM("tiny", executor="sim", pipeline_parallel=2)
    with pytest.raises(ConfigError, match=r"^engine.sim_pp=0 is invalid: must be > 0$"):
        parse_config(compose_config([f"experiment={OVERLAY}", "engine.sim_pp=0"]))


def test_the_falcon_overlay_is_the_paper_s_layout_and_its_budget_sees_both_stages():
    run = parse_config(compose_config([f"experiment={OVERLAY}", "scheduler=sarathi_serve"]))
    engine = run.engine
    assert (engine.model, engine.sim_device, engine.sim_tp, engine.sim_pp, run.seq_len, run.slo.tbt_p99_s) == \
        ("falcon-180b", "a100", 4, 2, 2048, 1.0)
    model, described = budget_cost_model(engine)
    assert isinstance(model, PipelineCostModel)
    assert described == "roofline a100 x4 (tensor parallel) x2 (pipeline stages)"


def test_the_falcon_overlay_runs_a_capacity_search_end_to_end(tmp_path):
    # The overlay's one job through the command a user runs, on a trace of 16 requests and two trials.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", f"experiment={OVERLAY}", "scheduler=sarathi_serve",
                           "workload.num_requests=16", "capacity.max_trials=2", f"hydra.run.dir={tmp_path}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((tmp_path / "capacity.json").read_text())
    assert len(found["trials"]) == 2 and found["capacity_rps"] > 0
    trial = json.loads(next(tmp_path.glob("trial-0-*/metrics.json")).read_text())
    assert (trial["environment"]["sim_tp"], trial["environment"]["sim_pp"]) == (4, 2)
    assert trial["environment"]["device_name"] == "simulated 8x A100 (roofline cost model, 2 pipeline stages)"
    assert run_source(trial["environment"], None) == "simulated 8 x A100 (roofline, TP4 x PP2)"
