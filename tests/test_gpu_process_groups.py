"""The GPU worker runs its paper steps one after another in one process (measure/gpu/sweep_here.py),
so steps of one model build it once (model/shared_engine.py), and the plan counts set-up once per
process group (measure/gpu/process_groups.py, budget.py): the group's first paper step pays the
process's set-up, each later one its own sweep's."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import budget, process_groups
from sarathi_lab.measure.gpu.parts import Estimate
from sarathi_lab.measure.gpu.plan import BY_NAME, Step
from sarathi_lab.measure.gpu.sweep_here import run_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEP = process_groups.SWEEP_SETUP_S


def paper(name: str, model: str = "llama-13b") -> Step:
    return Step(f"paper.{name}", 1.0, "", name, ("model=llama-13b", "device=cuda", "dtype=bfloat16",
                                                 f"model={model}", "seed=0,1"))


def test_steps_of_one_engine_in_a_row_share_a_process_and_any_other_step_ends_it():
    steps = [Step("launch", 1.0, ""), paper("a"), paper("b"), Step("profile.llama-13b", 1.0, "", "llama-13b"),
             paper("c"), paper("d", "mistral-7b"), Step("kernels", 1.0, ""), paper("e", "mistral-7b")]
    found = [(g.engine, [s.name for s in g.steps]) for g in process_groups.groups(steps)]
    assert found == [("launch", ["launch"]),
                     ("llama-13b bfloat16 cuda", ["paper.a", "paper.b", "profile.llama-13b", "paper.c"]),
                     ("mistral-7b bfloat16 cuda", ["paper.d"]), ("kernels", ["kernels"]),
                     ("mistral-7b bfloat16 cuda", ["paper.e"])]
    # The suite's own: SARATHI's seven steps on LLaMA-13B in one process, Sarathi-Serve's two on Mistral-7B.
    suite = {g.engine: [s.name for s in g.paper] for g in process_groups.groups(list(BY_NAME.values()))
             if g.paper}
    assert [len(v) for v in suite.values()] == [7, 2]


def test_a_process_group_pays_the_process_set_up_once_and_each_sweep_its_own():
    steps = [paper("a"), paper("b"), paper("c")]
    alone = {"paper.a": Estimate(30.0, 4, 2.0, 1.0, "x"), "paper.b": Estimate(45.0, 2, 10.0, 0.0, "x"),
             "paper.c": Estimate(3.0, 1, 5.0, 0.0, "x")}
    grouped = process_groups.shared(steps, alone)
    # The first pays the most any of them paid alone, less its own sweep's; the others their sweep's.
    assert [(e.process_s, e.setup_s) for e in grouped.values()] == [(45.0 - SWEEP, SWEEP), (0.0, SWEEP),
                                                                     (0.0, 3.0)]
    assert all(grouped[n].jobs == alone[n].jobs and grouped[n].job_s == alone[n].job_s for n in alone)
    together = sum(e.seconds for e in grouped.values())
    # Each paid a process alone; together, one: the largest.
    assert together == pytest.approx(sum(e.seconds for e in alone.values()) - (30 - SWEEP))
    assert "in paper.a's process" in grouped["paper.b"].source
    # One step alone keeps its whole set-up.
    one = process_groups.shared([paper("a")], {"paper.a": alone["paper.a"]})["paper.a"]
    assert one.seconds == alone["paper.a"].seconds and one.process_s == 30.0 - SWEEP
    # Another step between them: two processes, each paying its own.
    split = process_groups.shared([paper("a"), Step("kernels", 1.0, ""), paper("b")], alone)
    assert split["paper.a"].process_s == 30.0 - SWEEP and split["paper.b"].process_s == 45.0 - SWEEP


def test_the_set_up_share_spreads_a_process_over_the_steps_that_share_it():
    steps = [paper("a"), paper("b")]
    grouped = process_groups.shared(steps, {"paper.a": Estimate(45.0, 1, 20.0, 0.0, "x"),
                                            "paper.b": Estimate(45.0, 1, 60.0, 0.0, "x")})
    process = 45.0 - SWEEP
    shares = budget.setup_shares(steps, grouped)
    # a: its sweep's 5 s and a quarter of the process's (its 25 of the group's 90 other seconds)
    assert shares["paper.a"] == pytest.approx((SWEEP + process * 25 / 90) / (25 + process * 25 / 90))
    assert shares["paper.b"] == pytest.approx((SWEEP + process * 65 / 90) / (65 + process * 65 / 90))
    (group,) = budget.group_setups(steps, grouped)
    assert group.setup_s == pytest.approx(process + 2 * SWEEP) and group.rest_s == pytest.approx(80.0)
    assert "one process for 2 paper steps: set-up 50 s" in group.line()


@pytest.mark.e2e
def test_two_paper_steps_of_a_dry_run_build_their_model_once(tmp_path):
    # per_token_cost's dry run is a sweep; decode_speedup's one job. In processes of their own, each built it.
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels")]))
    env.pop("OUT", None)
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu", "--dry-run", "--out", str(out),
                          "--steps", "paper.per_token_cost,paper.decode_speedup"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    models = {p.parts[-5]: json.loads(p.read_text())["environment"]["engine_setup"]["parts"]["model"]
              for p in out.glob("paper/*/multiruns/*/*/metrics.json")}
    assert models == {"per_token_cost": "built", "decode_speedup": "reused"}
    log = (out / "steps" / "paper.per_token_cost" / "sweep.log").read_text()
    assert log.count("engine: built model") == 1
    for name in ("paper.per_token_cost", "paper.decode_speedup"):
        assert json.loads((out / "steps" / name / "result.json").read_text())["status"] == "done"


@pytest.mark.e2e
def test_a_sweep_run_here_stops_at_its_deadline_gives_back_what_it_took_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *scales.overrides("pd_ratio", "ci"), "executor=sim", "on_existing=skip",
            "hydra.sweeper.params=null", "scheduler=static,sarathi", f"hydra.sweep.dir={sweep}"]
    argv, handlers = sys.argv[:], {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    stdout, root = os.fstat(1), logging.getLogger().handlers[:]
    log = tmp_path / "sweep.log"
    # The deadline falls as the second job starts: the first is kept, the call says it was stopped.
    alarm = ["+hydra.callbacks.stop._target_=tests.sweep_callbacks.AlarmAtJob", "+hydra.callbacks.stop.job=1"]
    assert run_sweep([*args, *alarm], log, None) is None
    assert sys.argv == argv and {s: signal.getsignal(s) for s in handlers} == handlers
    assert os.fstat(1).st_ino == stdout.st_ino and logging.getLogger().handlers == root
    assert len(list(sweep.glob("*/metrics.json"))) == 1 and "deadline stopped the sweep" in log.read_text()
    # Run again: the finished job is kept, the other runs.
    assert run_sweep(args, log, None) == 0
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert sorted(s["status"] for s in summary.values()) == ["ok", "ok", "ok", "skipped"]
