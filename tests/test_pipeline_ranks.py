"""Pipeline parallelism across real processes (gloo on 127.0.0.1) with several micro-batches in flight:
the single-process engine's tokens under every scheduler (greedy, and sampled with preemptions), a
timeline in which stage 0 runs a micro-batch while the last stage still runs the one before, and a
stage that dies or hangs ending the run with an error, never a hang. The two ranks are spawned once
and serve every two-rank engine of this file."""
from __future__ import annotations

import itertools

import pytest

from sarathi_lab import LLM, SamplingParams
from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.host_features import usable_cores
from sarathi_lab.model.parallel import driver

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two cores")]

PROMPTS = [[7] * 30, [3, 1, 4, 1, 5, 9, 2, 6], [11] * 17, [2] * 3]
NEW = [5, 9, 4, 7]
SETTINGS = {"chunk_size": 12, "max_batch_size": 3, "device": "cpu", "dtype": "float32", "warmup_iters": 0,
            "seed": 5, "num_threads": 1, "collective_timeout_s": 30, "max_model_len": 64}


def overlapped(llm: LLM) -> bool:
    """Whether a micro-batch was submitted before the one ahead of it had returned its tokens."""
    its = llm.metrics.iterations
    return any(b.start < a.start + a.duration for a, b in itertools.pairwise(its))


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_two_stages_with_micro_batches_in_flight_give_the_single_process_engines_tokens(scheduler):
    want = LLM("tiny", scheduler=scheduler, **SETTINGS).generate(PROMPTS, NEW)
    # Two ranks as two pipeline stages (layers 0-1 and 2-3).
    llm = LLM("tiny", scheduler=scheduler, pipeline_parallel=2, **SETTINGS)
    assert llm.generate(PROMPTS, NEW) == want
    assert overlapped(llm)
    assert len(llm.engine.executor.broadcast_s) == len(llm.metrics.iterations)


def test_sampled_tokens_with_preemptions_are_the_single_process_engines():
    # Sampled tokens are keyed by request and position, so the micro-batch a token rides in, and the
    # preemptions a smaller cache makes of the requests not in flight, change none of them.
    sampling = SamplingParams(temperature=1.5, top_p=0.9, seed=11)
    tight = {**SETTINGS, "num_kv_blocks": 5, "block_size": 16}
    prompts = [[(7 * i + 3 * j) % 4000 for j in range(n)] for i, n in enumerate([40, 9, 23, 3, 17])]
    new = [6, 20, 5, 24, 15]
    want = LLM("tiny", **tight).generate(prompts, new, sampling=sampling)
    llm = LLM("tiny", pipeline_parallel=2, **tight)
    assert llm.generate(prompts, new, sampling=sampling) == want
    assert overlapped(llm) and llm.metrics.summary()["num_preemptions"] > 0


def check_timeline(llm: LLM, stages: int, tp: int) -> None:
    """The executor's timeline against the run's iterations: every rank ran every micro-batch once, a
    stage only after the one before it, and stage 0 started some micro-batch before the last stage
    had finished the one before it (several in flight)."""
    timeline = llm.engine.executor.stage_timeline()
    its = llm.metrics.iterations
    assert sorted(set(timeline["rank"])) == list(range(stages * tp))
    assert list(timeline.columns) == ["rank", "stage", "micro_batch", "start_s", "end_s", "tokens", "prefill_tokens",
                                      "command_s", "planned_s"]
    by_rank = {rank: rows.set_index("micro_batch") for rank, rows in timeline.groupby("rank")}
    for rank, rows in by_rank.items():
        assert list(rows.index) == list(range(len(its)))
        assert list(rows.tokens) == [i.num_prefill_tokens + i.num_decode_tokens for i in its]
        assert list(rows.prefill_tokens) == [i.num_prefill_tokens for i in its]
        assert (rows.end_s >= rows.start_s).all()
        # Its host work on each command came before its compute, and after its previous compute.
        assert (rows.command_s <= rows.planned_s).all() and (rows.planned_s <= rows.start_s).all()
        assert (rows.command_s.to_numpy()[1:] >= rows.end_s.to_numpy()[:-1]).all()
        if rank >= tp:  # its activations come from the same rank of the stage before
            assert (rows.start_s >= by_rank[rank - tp].end_s).all()
    first, last = by_rank[0], by_rank[(stages - 1) * tp]
    assert (first.start_s.to_numpy()[1:] < last.end_s.to_numpy()[:-1]).any()


def test_the_stage_timeline_shows_stage_0_running_ahead_of_the_last_stage():
    llm = LLM("tiny", scheduler="sarathi_serve", pipeline_parallel=2, **(SETTINGS | {"chunk_size": 16}))
    prompts = [[(5 * i + j) % 300 for j in range(20 + 3 * i)] for i in range(6)]
    llm.generate(prompts, 8)
    check_timeline(llm, stages=2, tp=1)
    # Rows of a later run follow on, numbered from where the last one stopped.
    executor = llm.engine.executor
    first = executor.micro_batches_submitted
    assert first == len(llm.metrics.iterations)
    llm.generate(prompts[:2], 3)
    later = executor.stage_timeline().query("micro_batch >= @first")
    assert list(later.query("rank == 1").tokens) == [i.num_prefill_tokens + i.num_decode_tokens
                                                     for i in llm.metrics.iterations]


def test_a_run_stopped_by_its_caller_leaves_the_pipeline_empty_for_the_next():
    want = LLM("tiny", **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", pipeline_parallel=2, **SETTINGS)

    def stop(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, NEW, on_iteration=stop)
    assert llm.generate(PROMPTS, NEW) == want


def test_the_same_ranks_serve_a_pipeline_then_tensor_parallelism_then_a_pipeline_again():
    # A pipeline's commands come point to point, tensor parallelism's by broadcast: each engine's
    # build reaches the ranks the way the one before listened.
    want = LLM("tiny", **SETTINGS).generate(PROMPTS, NEW)
    ranks = driver.ranks(2)
    for layout in ({"pipeline_parallel": 2}, {"tensor_parallel": 2}, {"pipeline_parallel": 2}):
        assert LLM("tiny", **layout, **SETTINGS).generate(PROMPTS, NEW) == want
    assert driver._ranks is ranks  # never respawned


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["sarathi", "vllm"])
def test_two_stages_of_two_ranks_give_the_single_process_engines_tokens(scheduler, monkeypatch):
    # Four ranks on this machine's cores (the check counts one core each; the test's ranks share them).
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 4)
    want = LLM("tiny", scheduler=scheduler, **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", scheduler=scheduler, tensor_parallel=2, pipeline_parallel=2, **SETTINGS)
    assert llm.generate(PROMPTS, NEW) == want
    assert overlapped(llm)
    check_timeline(llm, stages=2, tp=2)


@pytest.mark.slow
def test_three_stages_pass_micro_batches_through_the_middle_one(monkeypatch):
    # Layers 0-1, 2 and 3: the middle rank takes each micro-batch from stage 0 and hands it on.
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 3)
    want = LLM("tiny", scheduler="sarathi_serve", **SETTINGS).generate(PROMPTS, NEW)
    llm = LLM("tiny", scheduler="sarathi_serve", pipeline_parallel=3, **SETTINGS)
    assert llm.generate(PROMPTS, NEW) == want
    assert overlapped(llm)
    check_timeline(llm, stages=3, tp=1)
