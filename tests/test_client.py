"""The client of a serving run (engine/client.py), one for every engine: the concurrency cap by hand
on a toy engine of one second a step, and, where vLLM is installed, our engine and vLLM's admitting
the same requests at the same step under a cap."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from sarathi_lab.engine.client import serve
from sarathi_lab.engine.sequence import Sequence

NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason='vLLM is not installed (pip install -e ".[vllm]")')


class Clocked:
    """A clock of its own, which the client reads and moves on to the next arrival."""

    now: float

    def elapsed(self):
        return self.now

    def wait_until(self, t):
        self.now = max(self.now, t)


class Toy(Clocked):
    """Every request in the system gets one token a step; a step takes one second."""

    def __init__(self):
        self.now, self.left, self.log = 0.0, {}, []

    def add_request(self, seq):
        self.log.append((seq.seq_id, seq.arrival, self.now))
        self.left[seq.seq_id] = seq.max_new_tokens

    def advance(self):
        if not self.left:
            return False, None
        self.now += 1.0
        self.left = {i: n - 1 for i, n in self.left.items() if n > 1}
        return True, None

    def has_work(self):
        return bool(self.left)

    def in_system(self):
        return len(self.left)

    def abandon(self):
        self.left.clear()


def _toy(arrivals, tokens, cap):
    toy = Toy()
    serve(toy, [Sequence(i, [1], n, a) for i, (a, n) in enumerate(zip(arrivals, tokens))],
          max_concurrency=cap)
    return toy.log


def test_a_request_held_at_the_cap_is_sent_and_arrives_when_one_finishes():
    # Two at once: r2 and r3 wait for r0 and r1 to finish at 2 s, r4 (due 2.5 s) for them at 4 s.
    assert _toy([0, 0, 0, 0.5, 2.5], [2] * 5, cap=2) == [
        (0, 0, 0), (1, 0, 0), (2, 2.0, 2.0), (3, 2.0, 2.0), (4, 4.0, 4.0)]
    # Without a cap every request arrives when it is due, checked between steps.
    assert _toy([0, 0, 0, 0.5, 2.5], [2] * 5, cap=None) == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0.5, 1.0), (4, 2.5, 3.0)]


def test_a_request_due_during_a_step_with_a_connection_free_keeps_its_arrival():
    # r1 is due at 0.5 s, during the first step, while r0 alone holds one of two connections.
    assert _toy([0, 0.5, 0.7], [3, 3, 3], cap=2) == [(0, 0, 0), (1, 0.5, 1.0), (2, 3.0, 3.0)]


class Stepped(Clocked):
    """An engine on a clock of one second a step: what the client admits, step by step."""

    def __init__(self, engine):
        self.engine, self.now, self.log = engine, 0.0, []

    def add_request(self, seq):
        self.log.append((seq.seq_id, seq.arrival, self.now))
        self.engine.add_request(seq)

    def advance(self):
        moved, record = self.engine.advance()
        self.now += moved
        return moved, record

    def has_work(self):
        return self.engine.has_work()

    def in_system(self):
        return self.engine.in_system()

    def abandon(self):
        self.engine.abandon()


@NEEDS_VLLM
@pytest.mark.slow
def test_our_engine_and_vllm_s_admit_the_same_requests_at_the_same_step_under_a_cap():
    """Both engines from one plan's settings (sarathi_serve: vLLM with chunked prefill at the token
    budget), each stepped on a clock of one second a step; in a fresh interpreter, as vLLM's engine
    holds process-wide state."""
    code = """
import json
from sarathi_lab import LLM, SamplingParams
from sarathi_lab.config import EngineConfig
from sarathi_lab.engine import client, llm_engine
from sarathi_lab.harness import vllm_engine
from sarathi_lab.plan import plan_engine
from tests.test_client import Stepped
logs = []
def stepped(engine, seqs, on_iteration=None, max_concurrency=None):
    wrapped = Stepped(engine)
    client.serve(wrapped, seqs, on_iteration, max_concurrency)
    logs.append(wrapped.log)
llm_engine.serve = vllm_engine.serve = stepped
s = dict(model="tiny", scheduler="sarathi_serve", chunk_size=16, max_batch_size=3, dtype="float32",
         num_kv_blocks=64, device="cpu", max_model_len=256, seed=7, num_threads=1, cuda_graphs=False)
prompts, new = [[3] * 5, [4] * 6, [5] * 4, [6] * 5, [7] * 3, [8] * 6], [3, 5, 2, 4, 3, 2]
arrivals = [0.0, 0.5, 1.2, 1.5, 2.0, 9.0]
greedy = SamplingParams(ignore_eos=True)
out = []
for make in (lambda: LLM(**s), lambda: vllm_engine.VllmLLM(plan_engine(EngineConfig(executor="vllm", **s)))):
    llm = make()   # after its warm-up, if any
    llm.generate(prompts, new, sampling=greedy, arrival_times=arrivals, max_concurrency=2)
    out.append(logs[-1])
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # Each engine numbers the call's requests from its own next id (ours after its warm-up's).
    ours, theirs = ([(i - log[0][0], *rest) for i, *rest in log]
                    for log in json.loads(done.stdout.strip().splitlines()[-1]))
    # The second request, due during the first step with a connection free, keeps its arrival (the
    # adapter's own rule had moved it to the step's end); later ones wait for a connection.
    assert ours[1] == (1, 0.5, 1.0) and len(ours) == 6
    assert any(arrival > due for (_, arrival, _), due in zip(ours, [0.0, 0.5, 1.2, 1.5, 2.0, 9.0]))
    assert theirs == ours, (ours, theirs)
