"""The GPU suite (python -m sarathi_lab.measure gpu): its dry run end to end in a fresh interpreter, and
the parts a GPU call relies on (resume, restore, budget, reading the kernel check) as unit tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sarathi_lab.analysis import registry
from sarathi_lab.harness import scales
from sarathi_lab.measure.gpu import queue, state
from sarathi_lab.measure.gpu.packing import pack
from sarathi_lab.measure.gpu.plan import BY_NAME, STEPS, format_plan, select
from sarathi_lab.measure.gpu.state import Metric, StepResult
from sarathi_lab.measure.gpu.suite import exit_code, pending, record_killed
from sarathi_lab.measure.gpu.wheels import installs_there

ROOT = Path(__file__).resolve().parents[1]


def suite(*args: str, out_env: Path | None = None, timeout: float = 600,
          first_on_path: Path | None = None) -> subprocess.CompletedProcess:
    path = [str(first_on_path)] * (first_on_path is not None) + [str(ROOT), str(ROOT / "kernels")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("OUT", None)
    if out_env is not None:
        env["OUT"] = str(out_env)
    return subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu", *args], cwd=ROOT, env=env,
                          capture_output=True,
                          text=True, timeout=timeout, check=False)


# Steps whose dry run another test owns, left out of the whole dry run here: tune's by test_tuned_kernels
# (tune.run on a dry context), and these paper steps' dry jobs by --own's dry run (test_gpu_own: the same
# dry job, per_token_cost's sweep in the worker's process). Their lease jobs' check runs below, in process.
DRY_RUN_ELSEWHERE = ("tune", "paper.per_token_cost", "paper.tile_quantization", "paper.capacity.strict")
LEASE_CHECKED_HERE = DRY_RUN_ELSEWHERE[1:]


@pytest.mark.e2e
def test_dry_run_produces_every_step_and_resumes(tmp_path):
    out, exported = tmp_path / "suite", tmp_path / "OUT"
    steps = [s for s in STEPS if s.name not in DRY_RUN_ELSEWHERE]
    assert len(steps) == len(STEPS) - len(DRY_RUN_ELSEWHERE)  # each still a step
    run = suite("--dry-run", "--out", str(out), "--steps", ",".join(s.name for s in steps), out_env=exported)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for step in steps:
        result = state.read_result(out, step.name)
        assert result is not None, f"{step.name} wrote no result"
        assert result.status in ("done", "unavailable"), (step.name, result.error)
        assert state.is_done(out, step.name) == (result.status == "done")
    overhead = {m.metric: m.value for m in state.read_result(out, "overhead").metrics}
    assert {"prepare_us_after_forward[decode]", "host_arrays_us_hot[decode]", "stalled_iterations[decode]",
            "cuda_graphs_captured"} <= set(overhead) and overhead["cuda_graphs_captured"] == 0  # a CPU
    hybrid = state.read_result(out, "hybrid")
    assert hybrid.status == "done" and any(m.metric.startswith("hybrid_attention_over_sequential[")
                                           for m in hybrid.metrics)
    files = sorted(p.name for p in exported.iterdir())
    assert len(files) <= state.MAX_OUT_FILES and all(p.is_file() for p in exported.iterdir())
    assert {"summary.json", "summary.csv", state.ARCHIVE} <= set(files)
    summary = json.loads((exported / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [s.name for s in steps]
    with tarfile.open(exported / state.ARCHIVE) as tar:
        assert "steps/env/DONE" in tar.getnames()
    # The dry run's tiny paper jobs say in their own records that they are the quick set.
    scales = {json.loads(p.read_text())["config"]["scale"] for p in out.glob("paper/*/multiruns/*/*/metrics.json")}
    assert scales == {"ci"}

    # The same command again starts no worker: every step is finished or unavailable.
    done_mtime = (state.step_dir(out, "env") / "DONE").stat().st_mtime
    again = suite("--dry-run", "--out", str(out), "--steps", "env,engine")
    assert again.returncode == 0 and "2 of 2 steps already finished" in again.stdout
    assert (state.step_dir(out, "env") / "DONE").stat().st_mtime == done_mtime


@pytest.mark.parametrize("name", LEASE_CHECKED_HERE)
def test_the_lease_jobs_of_steps_dry_run_elsewhere_compose_and_fit_an_80gb_card(name):
    # What the dry run checks of a paper step before its dry job: every lease job through the schema
    # and the KV plan (--own's dry run checks its own, unscaled jobs).
    from sarathi_lab.measure.gpu.steps.paper import check_gpu_jobs, job_overrides

    validated, worst = check_gpu_jobs(BY_NAME[name])
    assert validated.value == len(job_overrides(BY_NAME[name])) and worst.holds, worst


def test_a_budget_no_step_fits_is_refused_not_deferred_forever(tmp_path):
    # Longer than the whole budget: every call of the same budget would start nothing and exit 3
    # ("call again"); refused in one line instead, before anything is written.
    run = suite("--dry-run", "--out", str(tmp_path / "out"), "--steps", "paper.pd_ratio", "--budget-min", "0.05")
    assert run.returncode == 2, run.stdout + run.stderr
    # The step's minutes as the kept leases measured it (queue.measured).
    (step,), _ = queue.measured([BY_NAME["paper.pd_ratio"]], ROOT / "docs" / "gpu")
    assert run.stderr.splitlines() == [("error: --budget-min=0.05 is invalid: no selected step fits in it (the "
                                        f"shortest expects {step.minutes:.1f} min); allowed: >= {step.minutes:.1f}")]
    assert not (tmp_path / "out").exists()


def test_a_worker_that_dies_before_any_step_is_not_restarted_forever(tmp_path):
    # A torch that fails to import (the driver never imports it, the worker does at once): the
    # worker dies before recording a step, and the driver used to start worker after worker, each
    # dying alike (40 in 40 s), until its budget ran out; in a dry run, which has none, forever.
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('libcudart.so: cannot open shared object')\n")
    run = suite("--dry-run", "--out", str(tmp_path / "out"), "--steps", "env", timeout=60, first_on_path=broken)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.count("Traceback") == 1, run.stderr[-2000:]
    assert "ended with 1 before it settled any step" in run.stdout


def test_plan_prints_every_step_and_the_calls():
    run = suite("--plan")
    assert run.returncode == 0, run.stderr
    for step in STEPS:
        assert step.name in run.stdout
    assert "call 1:" in run.stdout and "total" in run.stdout


def test_bad_arguments_fail_with_one_line(tmp_path):
    run = suite("--steps", "env,nope", "--plan")
    assert run.returncode == 2 and "'nope' is no step" in run.stderr
    run = suite("--budget-min", "nan", "--plan")
    assert run.returncode == 2 and "--budget-min=nan is invalid" in run.stderr
    (tmp_path / "a_file").write_text("")
    run = suite("--dry-run", "--steps", "env", "--out", str(tmp_path / "a_file"), timeout=60)
    assert run.returncode == 2 and f"--out={tmp_path / 'a_file'} is invalid: must be a directory" in run.stderr


def test_select_by_group_keeps_suite_order():
    assert [s.name for s in select("paper.pd_ratio,env")] == ["env", "paper.pd_ratio"]
    assert all(s.group == "profile" for s in select("profile")) and len(select("profile")) == 3


def test_pack_fits_each_call_and_keeps_every_step():
    calls = pack([list(STEPS)], 9.0).calls
    assert sorted(s.name for call in calls for s in call) == sorted(BY_NAME)
    assert all(sum(s.minutes for s in call) <= 9.0 for call in calls)
    assert "call 1:" in format_plan(list(STEPS), 9.0)


def test_plan_puts_no_step_longer_than_the_budget_in_a_call():
    # The driver never starts a step longer than --budget-min; the plan used to give each its own
    # call ("call 5: 3.5 min paper.pd_ratio" at --budget-min 3), one that would never run it.
    calls = pack([list(STEPS)], 3.0).calls
    assert all(s.minutes <= 3.0 for call in calls for s in call)
    plan = format_plan(list(STEPS), 3.0)
    assert ("not started at --budget-min=3: paper.pd_ratio (4.4 min), paper.chunk_batch (4.4 min), "
            "paper.orca_compare (4.1 min)") in plan
    assert "paper.scheduler_latency (8.5 min)" in plan and "paper.capacity.strict (4.5 min)" in plan
    assert "not started" not in format_plan(list(STEPS), 9.0)


def test_plan_says_the_context_each_profile_step_runs_at():
    # --plan (and docs/gpu/README.md) said context<=4096 for llama-13b, whose step runs seq_len=3072.
    from sarathi_lab.measure.gpu.steps.profile import overrides

    for step in (s for s in STEPS if s.group == "profile"):
        (seq_len,) = [o.split("=")[1] for o in overrides(step.arg, dry_run=False) if o.startswith("seq_len=")]
        assert f"context<={seq_len}," in step.what, step


def _result(out: Path, name: str, status: str, started: float | None = None) -> None:
    state.write_result(out, StepResult(name, status, started or time.time(), 1.0, [Metric("x", 1)]))


def test_resume_skips_done_and_failed_but_reruns_the_rest(tmp_path):
    steps = [BY_NAME[n] for n in ("env", "kernels", "engine", "overhead", "paper.pd_ratio")]
    _result(tmp_path, "env", "done")
    _result(tmp_path, "kernels", "failed")
    _result(tmp_path, "engine", "incomplete")
    _result(tmp_path, "overhead", "unavailable")
    names = [s.name for s in pending(tmp_path, steps, set(), retry_failed=False)]
    assert names == ["engine", "overhead", "paper.pd_ratio"]
    assert "kernels" in [s.name for s in pending(tmp_path, steps, set(), retry_failed=True)]
    assert "kernels" in [s.name for s in pending(tmp_path, steps, {"kernels"}, retry_failed=False)]
    assert state.is_done(tmp_path, "env") and not state.is_done(tmp_path, "engine")


def test_a_failed_step_named_in_steps_is_retried_whatever_the_spaces(tmp_path):
    # "env, kernels" selects kernels (select strips the names) but the driver read " kernels" as
    # the name given, so the failed step, named to retry it, was skipped as "failed before".
    _result(tmp_path, "env", "done")
    _result(tmp_path, "kernels", "failed")
    run = suite("--dry-run", "--out", str(tmp_path), "--steps", "env, kernels", "--budget-min", "0.5", timeout=60)
    # kernels is the one step left (3 min): none fits half a minute, which the refusal says before any starts.
    assert "none of the 1 steps left" in run.stderr and "expects 3.0 min" in run.stderr, run.stdout + run.stderr


def test_a_rerun_of_a_done_step_clears_its_marker_until_it_finishes(tmp_path):
    _result(tmp_path, "env", "done")
    state.mark_started(tmp_path, "env")
    assert not state.is_done(tmp_path, "env")
    _result(tmp_path, "env", "failed")
    assert not state.is_done(tmp_path, "env")


def test_a_killed_step_is_recorded_incomplete(tmp_path):
    since = time.time() - 1
    state.mark_started(tmp_path, "engine")
    record_killed(tmp_path, [BY_NAME["engine"], BY_NAME["env"]], since, "worker ended with -15")
    engine = state.read_result(tmp_path, "engine")
    assert engine.status == "incomplete" and "-15" in engine.error
    assert state.read_result(tmp_path, "env") is None
    assert exit_code(tmp_path, ["engine"]) == 3


def test_exit_code(tmp_path):
    _result(tmp_path, "env", "done")
    _result(tmp_path, "profile.llama-13b", "unavailable")
    assert exit_code(tmp_path, ["env", "profile.llama-13b"]) == 0
    _result(tmp_path, "kernels", "failed")
    assert exit_code(tmp_path, ["env", "kernels"]) == 1


def test_restore_fills_gaps_and_never_overwrites(tmp_path):
    first, archive = tmp_path / "first", tmp_path / "suite.tar.gz"
    _result(first, "env", "done")
    _result(first, "engine", "done")
    state.archive(first, archive)
    fresh = tmp_path / "fresh"
    assert state.restore(fresh, archive) > 0
    assert state.is_done(fresh, "env") and state.is_done(fresh, "engine")
    warm = tmp_path / "warm"
    _result(warm, "engine", "failed")
    state.restore(warm, archive)
    assert state.read_result(warm, "engine").status == "failed"   # what the machine kept wins
    assert state.is_done(warm, "env")
    # A suite's first call has no archive yet: the driver says so and never calls restore.
    with pytest.raises(ValueError, match="not a readable tar archive"):
        state.restore(tmp_path / "x", tmp_path / "missing.tar.gz")


def test_archive_leaves_out_the_largest_files_but_never_the_resume_state(tmp_path, monkeypatch):
    # A remote job drops a file over its 16 MiB limit: an archive still too big without its
    # per-iteration tables came back as nothing, every step's resume state with it.
    monkeypatch.setattr(state, "MAX_FILE_BYTES", 2 << 20)
    out, dest = tmp_path / "out", tmp_path / "suite.tar.gz"
    _result(out, "env", "done")
    _result(out, "paper.pd_ratio", "done")
    runs = state.step_dir(out, "paper.pd_ratio")
    (runs / "iterations.csv").write_bytes(os.urandom(1 << 20))   # random: gzip cannot shrink it
    (runs / "trials.parquet").write_bytes(os.urandom(3 << 20))
    (runs / "claims.csv").write_text("experiment,claim\n")
    notes = state.archive(out, dest)
    assert dest.stat().st_size <= 2 << 20
    with tarfile.open(dest) as tar:
        names = set(tar.getnames())
    assert {"steps/env/DONE", "steps/env/result.json", "steps/paper.pd_ratio/DONE",
            "steps/paper.pd_ratio/claims.csv"} <= names
    assert not {"steps/paper.pd_ratio/iterations.csv", "steps/paper.pd_ratio/trials.parquet"} & names
    assert any("trials.parquet (3.0 MiB) left out" in n for n in notes)
    fresh = tmp_path / "fresh"
    state.restore(fresh, dest)
    assert state.is_done(fresh, "env") and state.is_done(fresh, "paper.pd_ratio")


def _with_figures(tmp_path, n: int):
    """A finished env step and n figures in out; $OUT (dest) not yet made."""
    out, dest = tmp_path / "out", tmp_path / "OUT"
    _result(out, "env", "done")
    state.write_summary(out, ["env"], {"dry_run": True})
    (out / "figures").mkdir()
    for i in range(n):
        (out / "figures" / f"f{i}.png").write_bytes(b"png")
    return out, dest


def test_export_holds_at_most_eight_files(tmp_path):
    out, dest = _with_figures(tmp_path, 10)
    notes = state.export(out, dest)
    assert len(list(dest.iterdir())) == state.MAX_OUT_FILES
    assert any("figures" in n for n in notes)


def _kernel_check():
    """A kernel check as measure/profiling/kernel_check.py records it: failures of each kind, two decode cases
    and a prefill one, which no floor judges."""
    from sarathi_lab.measure.profiling.kernel_record import AttentionCase, KernelCheck, Timing, Verdict

    return KernelCheck(
        "NVIDIA H100 80GB HBM3",
        [AttentionCase("bfloat16", 64, 32, 32, 16, 3.1e-3, True),
         AttentionCase("bfloat16", 128, 32, 8, 32, 2.5e-2, False),
         AttentionCase("float32", 128, 32, 4, 16, 2e-7, True)],
        [Verdict("bfloat16", "block=16", True), Verdict("float32", "block=32", False)],
        [Verdict("bfloat16", "add_rms_norm", True), Verdict("bfloat16", "rope", False),
         Verdict("float32", "silu_mul", True)],
        "Llama-3-8B attention (32/8 heads, d=128), block 16", "bfloat16", 3000.2,
        [Timing("64 decodes x 2048 ctx", 0.2, 0.9, 2400.4), Timing("256 decodes x 512 ctx", 0.3, 1.0, 1500.0),
         Timing("chunk 512 after 1536", 0.1, 0.2, 100.0)])


def test_kernels_step_reads_the_kernel_check():
    from sarathi_lab.measure.gpu.steps.kernels import metrics_of

    metrics = {m.metric: m for m in metrics_of(_kernel_check(), copy_gbps=None)}
    assert metrics["attention_max_rel_err_bfloat16"].value == pytest.approx(2.5e-2)
    assert metrics["attention_max_rel_err_bfloat16"].holds is False
    assert metrics["attention_max_rel_err_float32"].holds is True
    assert metrics["kv_write_float32_cases_ok"].holds is False
    assert metrics["pointwise_bfloat16_cases_ok"].value == "1/2"
    assert metrics["pointwise_bfloat16_cases_ok"].holds is False
    assert metrics["pointwise_float32_cases_ok"].holds is True
    # In whole GB/s, as the check shows them: 3000 / 2400.
    assert metrics["decode_time_over_floor[64_decodes_x_2048_ctx]"].value == pytest.approx(1.25)
    assert metrics["decode_time_over_floor[64_decodes_x_2048_ctx]"].holds is True
    assert metrics["decode_time_over_floor[256_decodes_x_512_ctx]"].holds is False
    assert not any("chunk" in name for name in metrics)
    # The env step's copy ceiling wins over the check's own.
    ratio = {m.metric: m.value for m in metrics_of(_kernel_check(), copy_gbps=2400.0)}
    assert ratio["decode_time_over_floor[64_decodes_x_2048_ctx]"] == pytest.approx(1.0)
    empty = _kernel_check()
    empty.attention = []
    with pytest.raises(ValueError, match="no attention case"):
        metrics_of(empty, None)


def test_the_kernel_check_survives_its_json_and_names_the_timed_case():
    import dataclasses
    import json

    from sarathi_lab.measure.gpu.steps.kernels import metrics_of
    from sarathi_lab.measure.profiling.kernel_record import KernelCheck

    check = _kernel_check()
    again = KernelCheck.from_dict(json.loads(json.dumps(dataclasses.asdict(check))))
    assert again == check and again.ok is False
    case = {m.metric: m.value for m in metrics_of(again, None)}["decode_timed_case"]
    assert case == "Triton paged attention, Llama-3-8B attention (32/8 heads, d=128), block 16, bfloat16"


def test_paper_sweeps_expand_to_the_plans_jobs():
    from sarathi_lab.measure.gpu.steps.paper import job_overrides, sweep_argv

    jobs = job_overrides(BY_NAME["paper.pd_ratio"])
    assert len(jobs) == 3 * 3 * 2 and all("device=cuda" in job for job in jobs)
    argv = sweep_argv(BY_NAME["paper.decode_speedup"], Path("/x"))
    assert argv[1:5] == ["-m", "sarathi_lab.run", "-m", "experiment=decode_speedup"]
    assert "on_existing=skip" in argv and "hydra.sweep.dir=/x" in argv


def test_every_gpu_paper_point_repeats_over_three_seeds_interleaved_within_one_call():
    # The experiment's own axes are dropped, so the GPU run's order is Hydra's: seeds first (slowest),
    # so each repeat of the sweep runs after the last rather than back to back.
    for result in (r for r in registry.RESULTS if r.gpu is not None):
        assert "hydra.sweeper.params=null" in scales.overrides(result.name, "gpu"), result.name
        if result.gpu.parts:
            # A result split into steps repeats a step a seed (capacity's spread is its search's bracket).
            words = [o for p in result.gpu.parts for o in scales.overrides(result.name, "gpu", p.name)]
            seeds = {o.split("=", 1)[1] for o in words if o.startswith("seed=")}
            assert seeds in (set(), {"0", "1", "2"}), result.name
            assert all(p.minutes <= 9.0 for p in result.gpu.parts), result.name
            continue
        axes = [o.split("=", 1) for o in scales.overrides(result.name, "gpu") if "," in o]
        assert axes[0] == ["seed", "0,1,2"], result.name
        assert result.gpu.minutes <= 9.0, result.name


def test_the_gpu_runs_the_tile_aligned_chunks_the_claims_judge_and_the_fixed_ones_only_where_read():
    # ++: static's and orca's YAML have no such key; they ignore sarathi's knob. The claims judge the
    # aligned chunks (the paper's); chunk_batch's 320 is judged fixed, as the paper ran it.
    for name, key in (("decode_speedup", "scheduler.chunk_align"), ("orca_compare", "++scheduler.chunk_align"),
                      ("pd_ratio", "++scheduler.chunk_align")):
        assert f"{key}=tile" in scales.overrides(name, "gpu"), name
    assert "++scheduler.chunk_align=none,auto" in scales.overrides("chunk_batch", "gpu")
    # At the paper's setting (--own) the fixed chunk runs beside the aligned one.
    assert "scheduler.chunk_align=none,tile" in scales.overrides("decode_speedup", "own")
    # The compared schedulers vary fastest: a sarathi run right after the static run it is paired with.
    assert scales.overrides("pd_ratio", "gpu")[-1] == "scheduler=static,sarathi"


def test_collect_keeps_tables_figures_and_profiles_not_raw_runs(tmp_path):
    from sarathi_lab.measure.gpu.collect import collect

    out = tmp_path / "out"
    files = {"steps/env/env.json": json.dumps({"device": "NVIDIA H100 80GB HBM3"}), "summary.csv": "a\n",
             "steps/overhead/iterations.csv": "x\n", "figures/overhead.png": "png",
             "profiles/h100/llama-13b.csv": "op\n", "paper/pd_ratio/multiruns/gpu/0/metrics.json": "{}",
             "steps/engine/llama/config.json": "{}",
             "summary.json": json.dumps({"steps": [{"step": "env", "status": "done", "started_at": 1795716475.6,
                                                 "commit": "27958ff"}]})}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    state.archive(out, tmp_path / "suite.tar.gz")
    written = {str(p.relative_to(tmp_path / "repo")) for p in collect(tmp_path / "suite.tar.gz", tmp_path / "repo")}
    lease = "docs/gpu/h100/2026-11-26_27958ff"  # each lease its own folder (tests/test_writers.py)
    assert written == {f"{lease}/steps/env/env.json", f"{lease}/summary.csv", f"{lease}/summary.json",
                       f"{lease}/steps/overhead/iterations.csv", f"{lease}/figures/overhead.png",
                       f"{lease}/lease.json", "docs/gpu/leases.md", "profiles/h100/2026-11-26_27958ff/llama-13b.csv"}


def test_collect_refuses_an_archive_without_the_env_step_or_from_a_dry_run(tmp_path):
    # Without env.json: a KeyError traceback ("filename 'steps/env/env.json' not found"). A dry
    # run's archive was collected into docs/gpu/cpu/ and profiles/cpu/ as if measured on a GPU.
    out, archive = tmp_path / "out", tmp_path / "suite.tar.gz"
    _result(out, "kernels", "done")
    state.archive(out, archive)
    run = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "gpu_collect", str(archive)],
                         capture_output=True, text=True, check=False, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1].endswith(f"{archive} is invalid: it has no steps/env/env.json (the env step "
                                                "has not finished), so the device it measured is unknown")
    from sarathi_lab.measure.gpu.collect import collect

    (out / "steps" / "env").mkdir(parents=True)
    (out / "steps" / "env" / "env.json").write_text(json.dumps({"device": "cpu"}))
    state.write_summary(out, ["env", "kernels"], {"dry_run": True})
    state.archive(out, archive)
    with pytest.raises(ValueError, match="is invalid: a dry run's"):
        collect(archive, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("wheel, there", [
    ("hydra_core-1.3.2-py3-none-any.whl", True),
    ("antlr4_python3_runtime-4.9.3-py3-none-any.whl", True),  # built here from its sdist: pure Python
    ("psutil-7.0.0-cp36-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("pyyaml-6.0.2-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    # What pip wheel builds here from a source archive with C code: this interpreter, this machine.
    # The check let both through (any platform ending in x86_64 passed).
    ("pkg-1.0-cp311-cp311-linux_x86_64.whl", False),
    ("pkg-1.0-cp312-cp312-linux_x86_64.whl", False),
    ("pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", False),
    ("pkg-1.0-cp312-cp312-musllinux_1_2_x86_64.whl", False),
])
def test_only_wheels_the_gpu_machine_installs_are_carried(wheel, there):
    assert installs_there(wheel) == there


def test_cuda_memory_counts_what_earlier_engines_of_the_process_freed(monkeypatch):
    # A paper sweep runs its jobs one after another in one process. The last job's freed weights
    # and KV cache (0.9 of the card) stay reserved by torch's caching allocator, which
    # mem_get_info counts as taken: every job after the first was refused ("its weights take
    # 24.2 GiB, more than the 4.0 GiB available on cuda").
    import torch

    from sarathi_lab.model.memory import device_memory_bytes

    total, cached = 80 << 30, [74 << 30]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - cached[0], total))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cached.__setitem__(0, 0))
    assert device_memory_bytes(torch.device("cuda")) == total


def test_export_drops_the_figures_an_earlier_export_of_the_call_chose(tmp_path):
    # Each step's export copies the first figures into $OUT; when claims.csv (or a figure ranked
    # higher) appears later in the call, fewer or other figures are chosen, and the ones copied
    # before stayed: 9 files, over the 8 a call brings back.
    out, dest = _with_figures(tmp_path, 6)
    state.export(out, dest)
    (out / "claims.csv").write_text("experiment,claim\n")
    (out / "figures" / "kernels.png").write_bytes(b"png")
    state.export(out, dest)
    assert len(list(dest.iterdir())) == state.MAX_OUT_FILES
    assert (dest / "kernels.png").is_file() and (dest / "claims.csv").is_file()


def test_kernels_step_reports_a_kernel_check_crash_as_itself(tmp_path, monkeypatch):
    # The kernel check dying before its first check (a kernel the compiler rejects, an import), so
    # with no result written, is reported as that crash, with the process's last line.
    from sarathi_lab.measure.gpu.context import Context
    from sarathi_lab.measure.gpu.steps import kernels

    crash = subprocess.CompletedProcess([], 1, "device: NVIDIA H100 80GB HBM3\nattention vs attention/reference.py\n",
                                        "Traceback (most recent call last):\n  ...\n"
                                        "triton.compiler.errors.CompilationError: at 12:4: unsupported\n")
    monkeypatch.setattr(kernels.subprocess, "run", lambda *a, **k: crash)
    ctx = Context(tmp_path, tmp_path / "kernels", False, "cuda", None)
    ctx.dir.mkdir()
    with pytest.raises(RuntimeError, match=r"^the kernel check exited 1 before any check: "
                                           r"triton.compiler.errors.CompilationError: at 12:4: unsupported"):
        kernels.run(ctx, BY_NAME["kernels"])
    assert "CompilationError" in (ctx.dir / "check_gpu.log").read_text()


def test_each_step_records_the_commit_it_ran_at(tmp_path):
    # The suite runs over several calls, and the README says to fix a failed step and rerun it:
    # summary.json's one suite.commit, the last call's, was all that said which code measured
    # the steps of the calls before.
    from sarathi_lab.measure.gpu.context import Context
    from sarathi_lab.measure.gpu.worker import run_step

    ctx = Context(tmp_path, state.step_dir(tmp_path, "env"), True, "cpu", None)
    run_step(BY_NAME["env"], ctx, "abc1234")
    assert state.read_result(tmp_path, "env").commit == "abc1234"
    state.write_summary(tmp_path, ["env"], {"commit": "def5678"})
    step = json.loads((tmp_path / "summary.json").read_text())["steps"][0]
    # The device too: the driver's final summary is written with its own record, which has none.
    assert step["commit"] == "abc1234" and step["device"] == "cpu"


def test_a_failed_step_does_not_hide_the_steps_still_to_run(tmp_path):
    # The README has the same call made again while it exits 3; a failed step made it exit 1
    # even with steps never started, which the same call would run (it skips the failed one):
    # a session that followed the README left them for no reason.
    _result(tmp_path, "env", "done")
    _result(tmp_path, "kernels", "failed")
    assert exit_code(tmp_path, ["env", "kernels", "engine"]) == 3
    _result(tmp_path, "engine", "incomplete")
    assert exit_code(tmp_path, ["env", "kernels", "engine"]) == 3
    _result(tmp_path, "engine", "done")
    assert exit_code(tmp_path, ["env", "kernels", "engine"]) == 1


def test_an_archive_killed_mid_build_leaves_nothing_in_out_dir(tmp_path, monkeypatch):
    # Its temporary file sat in $OUT beside the 8 files a call brings back.
    out, dest = tmp_path / "out", tmp_path / "OUT"
    out.mkdir(), dest.mkdir()
    (out / "summary.json").write_text("{}")
    real_open = state.tarfile.open

    def killed(path, mode):
        real_open(path, mode).close()
        raise KeyboardInterrupt

    monkeypatch.setattr(state.tarfile, "open", killed)
    with pytest.raises(KeyboardInterrupt):
        state.archive(out, dest / state.ARCHIVE)
    assert list(dest.iterdir()) == []
    monkeypatch.setattr(state.tarfile, "open", real_open)
    state.archive(out, dest / state.ARCHIVE)  # a leftover temporary file is neither archived nor in the way
    assert [p.name for p in dest.iterdir()] == [state.ARCHIVE]
    with state.tarfile.open(dest / state.ARCHIVE) as tar:
        assert tar.getnames() == ["summary.json"]


def test_the_summary_holds_the_steps_of_earlier_calls(tmp_path):
    # A call that names --steps wrote a summary of its own steps alone, so the archive a lease's
    # last call brought back said nothing of what the calls before it had measured.
    _result(tmp_path, "kernels", "done")
    run = suite("--dry-run", "--out", str(tmp_path), "--steps", "env", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["env", "kernels"]


def test_launch_times_a_chunk_eager_and_as_the_engine_runs_it():
    # On the CPU the engine has no graphs: it runs the batch eagerly, says so (graph tokens 0), and
    # gives the eager forward's output; the batch's blocks go back.
    from sarathi_lab import LLM
    from sarathi_lab.measure.profiling.launch import measure

    llm = LLM("tiny", device="cpu", dtype="float32", max_batch_size=2, max_model_len=32, num_threads=1)
    free = llm.block_manager.num_free
    row = measure(llm, 16, 1, 32, reps=1)
    assert row["eager_ms"] > 0 and row["engine_ms"] > 0 and row["graph_tokens"] == 0 and row["rel_diff"] == 0
    assert llm.block_manager.num_free == free


def test_launch_step_names_each_iteration_against_its_floor(tmp_path, monkeypatch):
    # A reviewer's script reads engine_over_floor[c=<chunk>+b=<decodes>]: every chunk alone (b=0) and
    # beside 17 decodes, the decode batches as before, with the targets.
    from sarathi_lab import LLM
    from sarathi_lab.measure.gpu.context import Context
    from sarathi_lab.measure.gpu.steps import launch

    timed = []

    def fake_measure(llm, chunk, decodes, context, reps):
        timed.append((chunk, decodes))
        return {"eager_ms": 30.0, "engine_ms": 12.0, "graph_tokens": 0, "rel_diff": 0.0}

    def llm_with_graphs(**kwargs):  # what an engine on a GPU records of its graphs
        llm = LLM(**kwargs)
        llm.cuda_graphs = {"decode_sizes": [1, 2], "mixed_tokens": [16], "mixed_requests": 2, "capture_s": 0.5,
                           "pool_bytes": 3 << 20, "reserved_before_bytes": 1 << 20, "reserved_after_bytes": 5 << 20}
        return llm

    monkeypatch.setattr("sarathi_lab.measure.profiling.launch.measure", fake_measure)
    monkeypatch.setattr("sarathi_lab.LLM", llm_with_graphs)
    ctx = Context(tmp_path, state.step_dir(tmp_path, "launch"), True, "cpu", None)
    metrics, notes = launch.run(ctx, BY_NAME["launch"])
    by_name = {m.metric: m for m in metrics}
    cases = ["b=1", "b=18"] + [f"c={c}+b={b}" for c in (64, 128, 256, 512) for b in (0, 17)]
    cases += ["c=111+b=17", "c=239+b=17", "c=495+b=17"]  # the tile-aligned scheduler's chunks
    keys = cases + [f"{case},ctx=1024" for case in cases]  # the dry run's longer context
    assert [f"c={c}+b={b}" if c else f"b={b}" for c, b in timed] == cases * 2
    for key in keys:
        assert {f"{m}[{key}]" for m in ("eager_ms", "engine_ms", "floor_ms", "eager_over_floor", "engine_over_floor",
                                        "sequential_floor_ms", "engine_over_sequential_floor", "eager_over_engine",
                                        "engine_graph_tokens", "engine_rel_diff")} <= set(by_name)
        floor = by_name[f"floor_ms[{key}]"].value
        # floor_ms is rounded to 3 decimals and the ratio to 2, each from the unrounded floor measured
        # here: the ratio from the shown floor may differ by the first rounding's effect plus the second.
        slack = 12.0 * 0.0005 / floor**2 + 0.005 + 1e-9
        assert 0 < floor and abs(by_name[f"engine_over_floor[{key}]"].value - 12.0 / floor) <= slack
        assert by_name[f"sequential_floor_ms[{key}]"].value >= floor - 0.001
    tokens = {key: sum(int(part.split("=")[1]) for part in key.split(",")[0].split("+")) for key in keys}
    assert {key: by_name[f"engine_over_floor[{key}]"].target for key in keys} == {
        key: "" if not key.startswith("c=") else "<= 1.25" if tokens[key] >= 256 else "<= 1.5" for key in keys}
    assert {key: by_name[f"engine_over_sequential_floor[{key}]"].target for key in keys} == {
        key: "<= 1.15" if tokens[key] >= 256 else "" for key in keys}
    assert by_name["engine_over_floor[c=256+b=17]"].target == "<= 1.25"
    assert by_name["engine_over_floor[c=128+b=17]"].target == "<= 1.5"
    assert by_name["engine_over_floor[c=256+b=17]"].holds is None  # no verdict on the CPU's times
    assert [by_name[m].value for m in ("graphs_captured", "graph_capture_s", "graph_pool_mib", "graph_reserved_mib")
            ] == [3, 0.5, 3.0, 4.0]
    assert "decode sizes [1, 2], mixed token buckets [16] (each of up to 2 requests" in notes[1]
    assert "the env step has not run" in notes[-1]


def test_launch_times_the_hybrid_iterations_again_with_their_attention_co_scheduled(monkeypatch):
    # The 1.25x physical-floor target holds once prefill and decode attention are co-scheduled: the
    # step switches the engine to attention_hybrid=pod (its graphs captured again) and names those ,pod.
    from sarathi_lab import LLM
    from sarathi_lab.analysis.launch_grid import CASES
    from sarathi_lab.measure.gpu.steps import launch

    seen = []

    def fake_measure(llm, chunk, decodes, context, reps):
        seen.append((chunk, decodes, llm.model.backend.hybrid))
        return {"eager_ms": 30.0, "engine_ms": 12.0, "graph_tokens": 0, "rel_diff": 0.0}

    monkeypatch.setattr("sarathi_lab.measure.profiling.launch.measure", fake_measure)
    env = {"copy_gbps": 100.0, "matmul_tflops": 10.0}
    cpu = LLM("tiny", device="cpu", dtype="float32", max_batch_size=2, max_model_len=32)
    assert launch._co_scheduled(cpu, CASES, 512, 1, env, False)[0] == [] and not seen
    llm = LLM("tiny", device="cpu", dtype="float32", attention="triton", max_batch_size=2, max_model_len=32,
              warmup_iters=0)
    metrics, note = launch._co_scheduled(llm, CASES, 512, 1, env, False)
    assert seen == [(c, 17, "pod") for c in (256, 512, 239, 495)]
    keys = {m.metric for m in metrics}
    assert {f"engine_over_floor[c={c}+b=17,pod]" for c in (256, 512, 239, 495)} <= keys
    assert {m.target for m in metrics if m.metric.startswith("engine_over_floor[")} == {"<= 1.25"}
    assert llm.config.attention_hybrid == "pod" == llm.plan.config.attention_hybrid and "pod" in note


def test_an_engine_switched_to_co_scheduled_attention_gives_the_same_tokens():
    from sarathi_lab import LLM
    from sarathi_lab.config import ConfigError

    llm = LLM("tiny", device="cpu", dtype="float32", attention="triton", max_batch_size=3, max_model_len=64,
              chunk_size=16, scheduler="sarathi", warmup_iters=0)
    prompts, new = [[3] * 21, [5] * 4, [7] * 9], [3, 6, 4]
    sequential = llm.generate(prompts, max_new_tokens=new)
    llm.use_attention_hybrid("pod")
    assert llm.model.backend.hybrid == "pod" and llm.generate(prompts, max_new_tokens=new) == sequential
    with pytest.raises(ConfigError, match="^attention_hybrid='pod' is invalid with the torch attention"):
        LLM("tiny", device="cpu", dtype="float32", max_batch_size=2, max_model_len=32).use_attention_hybrid("pod")
