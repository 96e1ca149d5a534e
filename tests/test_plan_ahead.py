"""Planning the next iteration's attention ahead (Scheduler.likely_next, ModelExecutor.plan_ahead):
the predicted lengths are the next batch's where nothing joins or leaves, warming makes the next
lookup a hit, and it changes no plan and no token."""
from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.sim.executor import composition


def _lengths(batch):
    prefills, decodes = composition(batch)
    return ([q for q, _ in prefills] + [1] * len(decodes), [c for _, c in prefills] + decodes,
            len(prefills))


def simulated(scheduler: str, chunk: int, batch: int, prompts, new, arrivals):
    """Each iteration's request ids, lengths, preemptions and the scheduler's likely successor,
    taken as the executor sees the batch (scheduled, not yet updated)."""
    llm = LLM("llama2-7b", executor="sim", sim_device="a100", scheduler=scheduler,
              chunk_size=chunk, max_batch_size=batch)
    executor, scheduler_, seen = llm.engine.executor, llm.engine.scheduler, []
    execute = executor.execute

    def recorded(b):
        ids = {c.seq.seq_id for c in b.prefills} | {s.seq_id for s in b.decodes}
        seen.append((ids, _lengths(b), bool(b.preempted), scheduler_.likely_next(b)))
        return execute(b)

    executor.execute = recorded
    llm.generate(prompts, new, arrival_times=arrivals)
    return seen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheduler=st.sampled_from(["sarathi_serve", "sarathi", "vllm", "orca"]),
       chunk=st.sampled_from([32, 64, 100, 256]), batch=st.integers(1, 6),
       requests=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 12),
                                   st.floats(0, 0.05)), min_size=1, max_size=8))
def test_the_likely_next_batch_is_the_next_batch_where_nothing_joins_or_leaves(
        scheduler, chunk, batch, requests):
    prompts = [[1] * p for p, _, _ in requests]
    arrivals = np.cumsum([a for *_, a in requests]).tolist()
    seen = simulated(scheduler, chunk, batch, prompts, [n for _, n, _ in requests], arrivals)
    for (ids, _, _, likely), (next_ids, lengths, preempted, _) in pairwise(seen):
        if next_ids <= ids and not preempted:  # none joined; leaving by length is predicted
            assert likely is not None
            assert (likely.query_lens, likely.seq_lens, likely.num_prefills) == lengths


def test_most_sarathi_serve_iterations_are_predicted():
    from sarathi_lab.measure.bench.trace import workload

    prompts, new, arrivals = workload(16, (64, 700), (4, 40), 8.0)
    seen = simulated("sarathi_serve", 256, 8, prompts, new, arrivals)
    hits = [likely is not None and (likely.query_lens, likely.seq_lens, likely.num_prefills)
            == lengths for (*_, likely), (_, lengths, _, _) in pairwise(seen)]
    assert sum(hits) > 0.8 * len(hits)


def test_a_request_finishing_by_length_makes_room_in_the_guess():
    """A batch of one: each later request joins exactly as the one before it finishes by length,
    and the guess takes that join (its slot and its blocks freed) into account."""
    seen = simulated("sarathi_serve", 64, 1, [[1] * 40, [1] * 30, [1] * 20], [3, 2, 4], [0.0] * 3)
    joins = [(likely, lengths) for (ids, *_, likely), (next_ids, lengths, _, _) in pairwise(seen)
             if not next_ids <= ids]
    assert len(joins) == 2
    for likely, lengths in joins:
        assert (likely.query_lens, likely.seq_lens, likely.num_prefills) == lengths


@pytest.fixture
def h100_backend():
    from sarathi_kernels import chunk_plan
    from sarathi_kernels.occupancy import H100

    from sarathi_lab.attention.triton_backend import TritonAttention

    chunk_plan.clear_plan_cache()
    yield TritonAttention(limits=H100), torch.empty(1, 16, 8, 128, dtype=torch.bfloat16)
    chunk_plan.clear_plan_cache()


def _work(plan):
    return [None if launch is None or launch.balanced is None else
            [a.tolist() if isinstance(a, np.ndarray) else a for a in vars(launch.balanced.work).values()]
            for launch in (plan.prefill, plan.decode)]


def test_warming_makes_the_next_lookup_a_hit_and_changes_no_plan(h100_backend):
    from sarathi_kernels import chunk_plan

    from sarathi_lab.measure.bench.trace import workload

    backend, k_cache = h100_backend
    prompts, new, arrivals = workload(12, (64, 900), (4, 30), 8.0)
    seen = simulated("sarathi_serve", 512, 8, prompts, new, arrivals)
    predicted = 0
    for (*_, likely), (_, lengths, _, _) in pairwise(seen):
        chunk_plan.clear_plan_cache()
        fresh = _work(backend._plan_lengths(*lengths, 32, k_cache))
        chunk_plan.clear_plan_cache()
        if likely is not None:
            backend.warm(likely.query_lens, likely.seq_lens, likely.num_prefills, 32, k_cache)
        before = chunk_plan.plan_cache_counts()
        warmed = _work(backend._plan_lengths(*lengths, 32, k_cache))
        after = chunk_plan.plan_cache_counts()
        assert warmed == fresh
        if likely is not None and (likely.query_lens, likely.seq_lens,
                                   likely.num_prefills) == lengths:
            predicted += 1
            assert after["misses"] == before["misses"] and after["hits"] > before["hits"]
    assert predicted > 0


def test_plans_ahead_only_where_the_device_runs_asynchronously(monkeypatch):
    from sarathi_lab.model.runner import ModelRunner

    warmed = []
    monkeypatch.setattr(ModelRunner, "warm", lambda self, likely: warmed.append(likely))
    llm = LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, chunk_size=16)
    llm.generate([[5] * 40, [7] * 9], max_new_tokens=4)
    assert llm.engine.executor.plans_ahead is False and not warmed


def test_planning_ahead_changes_no_greedy_token(monkeypatch):
    from sarathi_lab.model.runner import ModelRunner

    prompts = [[3 + i % 50 for i in range(n)] for n in (37, 5, 61)]
    warmed = []
    monkeypatch.setattr(ModelRunner, "warm", lambda self, likely: warmed.append(likely))
    runs = []
    for ahead in (False, True):
        llm = LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, scheduler="sarathi_serve",
                  chunk_size=16, max_batch_size=3)
        llm.engine.executor.plans_ahead = ahead
        runs.append(llm.generate(prompts, max_new_tokens=6))
    assert runs[0] == runs[1] and warmed
