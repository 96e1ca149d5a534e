"""A capacity search rerun after an interruption resumes: the trials finished before the signal are
reused (not deleted and measured again without a word), and the search ends where an uninterrupted
one does."""
from __future__ import annotations

import json
import logging

import pytest

from sarathi_lab.engine.slo_guard import SLOGuard
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.interrupts import Interrupted

SEARCH = ["executor=sim", "model=tiny", "logger=none", "task=capacity", "batch_size=1", "seq_len=40", "pd_ratio=4",
          "workload.num_requests=20", "workload.arrival=gamma", "workload.cv=0.001", "slo.sched_delay_p50_s=0.0001",
          "capacity.start_qps=10"]


def test_a_rerun_reuses_the_finished_trials_and_ends_as_an_uninterrupted_search(tmp_path, monkeypatch, caplog):
    whole = tmp_path / "whole"
    run_in_process(SEARCH, whole)
    want = json.loads((whole / "capacity.json").read_text())

    resumed = tmp_path / "resumed"
    guards, real_call = [], SLOGuard.__call__

    def sigterm_in_the_second_trial(self, record):
        if self not in guards:
            guards.append(self)
        if len(guards) == 2 and record.iteration == 5:
            raise Interrupted(15)
        real_call(self, record)
    monkeypatch.setattr(SLOGuard, "__call__", sigterm_in_the_second_trial)
    with pytest.raises(Interrupted):
        run_in_process(SEARCH, resumed)
    first = (resumed / "trial-0-qps10" / "metrics.json").read_bytes()

    served = []

    def count(self, record):
        if self not in served:
            served.append(self)
        real_call(self, record)
    monkeypatch.setattr(SLOGuard, "__call__", count)
    with caplog.at_level(logging.INFO):
        run_in_process(SEARCH, resumed)
    got = json.loads((resumed / "capacity.json").read_text())
    assert got["capacity_rps"] == want["capacity_rps"]
    assert [(t["rate_rps"], t["passed"], t["binding"]) for t in got["trials"]] == \
        [(t["rate_rps"], t["passed"], t["binding"]) for t in want["trials"]]
    assert (resumed / "trial-0-qps10" / "metrics.json").read_bytes() == first
    assert len(served) == len(want["trials"]) - 1, "the finished trial was measured again"
    assert "trial 0 at 10 req/s: " in caplog.text and "reused from trial-0-qps10" in caplog.text
    assert sorted(p.name for p in resumed.glob("trial-*")) == sorted(t["run_dir"] for t in got["trials"])
