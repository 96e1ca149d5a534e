"""Sweeps through a real process-based launcher, failure isolation (a job that raises, a job
SIGKILLed) and the end-of-sweep summary, every job checked before the first runs under the basic
launcher, and a run stopped by SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.experimental.callback import Callback
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict, read_write

from sarathi_lab.harness import CONF_DIR, REPO_ROOT
from sarathi_lab.harness.job_dirs import MAX_NAME_CHARS, job_dir_name
from sarathi_lab.harness.results import load_runs, write_status
from sarathi_lab.harness.sweep import TRUST, summarize_sweep, sweep_table, table_notes
from sarathi_lab.harness.sweep_check import swept_jobs

TINY = ["experiment=smoke", "logger=none", "workload.num_requests=2", "seq_len=48", "pd_ratio=5"]


def _job(sweep: Path, num: int) -> Path:
    """Job num's folder, named <num>_<its overrides> (harness/job_dirs.py)."""
    (found,) = sweep.glob(f"{num}_*")
    return found


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sarathi_lab.run", *args]


@pytest.mark.e2e
def test_submitit_sweep_runs_jobs_as_processes_and_isolates_a_failing_one(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(_cli("-m", *TINY, "chunk=0,16", "hydra/launcher=submitit_local",
                               "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={sweep}"),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert list(sweep.glob(".submitit/*/*_submitted.pkl")), "jobs did not go through submitit"
    failed = json.loads((_job(sweep, 0) / "status.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "chunk=0 is invalid: must be > 0"
    assert not (_job(sweep, 0) / "metrics.json").exists()
    assert json.loads((_job(sweep, 1) / "status.json").read_text())["status"] == "ok"
    assert load_runs(sweep).chunk.tolist() == [16]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary == {_job(sweep, 0).name: {"status": "failed", "error": "chunk=0 is invalid: must be > 0"},
                       _job(sweep, 1).name: {"status": "ok", "error": None}}
    assert f"FAILED {_job(sweep, 0).name} (failed): chunk=0 is invalid" in proc.stdout + proc.stderr
    # The failed job, refused before it saved anything, in the table by the overrides its folder names.
    table = pd.read_csv(sweep / "sweep_summary.csv")
    assert table.status.tolist() == ["failed", "ok"] and table.chunk.tolist() == [0, 16]


@pytest.mark.parametrize("sweep, refused", [
    # The command line's sweeps: the last one varies fastest, so the bad value's first job is number 2.
    (["chunk=16,0", "seed=1,2"], ("sweep job 2 of 4 (", "chunk=0 seed=1): chunk=0 is invalid: must be > 0")),
    # An experiment's own sweep (hydra.sweeper.params) first, then the command line's, which wins.
    (["experiment=pd_ratio", "model=tiny", "pd_ratio=4,nan"],
     ("sweep job 2 of 8 (chunk=64 pd_ratio=nan scheduler=static", "): pd_ratio=nan is invalid")),
])
def test_a_sweep_with_a_bad_job_is_refused_before_any_job_runs(tmp_path, sweep, refused):
    # The basic launcher runs jobs one after another: job 2 was refused only once jobs 0 and 1 had run.
    base = [] if sweep[0].startswith("experiment=") else TINY
    proc = subprocess.run(_cli("-m", *base, *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-2000:]
    assert "Traceback" not in output and "Launching" not in output
    lines = [line for line in output.splitlines() if "sweep job" in line]
    assert len(lines) == 1 and all(part in lines[0] for part in refused), output
    assert proc.stderr.splitlines() == lines and lines[0].startswith("error: sweep job"), output
    assert lines[0].endswith("; no job was run"), output
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "outputs").exists()


class SigkillJob(Callback):
    """Test-only Hydra callback: SIGKILLs sweep job number `job` mid-run, as the OOM killer would
    (`beside`: a rerun into a finished job's dir, which runs in .<job>.next)."""

    def __init__(self, job: int, beside: bool = False) -> None:
        self.job, self.beside = job, beside

    def on_job_start(self, config, **kwargs) -> None:
        if config.hydra.job.num == self.job:
            out = Path(config.hydra.runtime.output_dir)
            out = out.parent / f".{out.name}.next" if self.beside else out
            threading.Thread(target=self._kill_once_running, args=(out,), daemon=True).start()

    @staticmethod
    def _kill_once_running(out: Path) -> None:
        _wait_for(lambda: _status(out) == "running", timeout_s=60, poll_s=0.005)
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.e2e
def test_safe_submitit_sweep_collects_every_job_and_records_a_killed_one(tmp_path):
    sweep = tmp_path / "sweep"
    # The killed job first: the plugin's own launcher would give up on the jobs after it.
    proc = subprocess.run(_cli("-m", *TINY, "chunk=16,32", "hydra/launcher=submitit_local_safe",
                               "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={sweep}",
                               f"+hydra.callbacks.kill._target_={__name__}.SigkillJob", "+hydra.callbacks.kill.job=0"),
                          capture_output=True, text=True, timeout=240, check=False,
                          env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})  # for tests.test_sweep, wherever pytest runs
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-2000:]
    assert "Traceback" not in output
    killed = json.loads((_job(sweep, 0) / "status.json").read_text())
    assert killed["status"] == "killed" and "SIGKILL" in killed["error"]
    assert not (_job(sweep, 0) / "metrics.json").exists()
    assert load_runs(sweep).chunk.tolist() == [32]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary == {_job(sweep, 0).name: {"status": "killed", "error": killed["error"]},
                       _job(sweep, 1).name: {"status": "ok", "error": None}}
    assert f"FAILED {_job(sweep, 0).name} (killed): {killed['error']}" in output


@pytest.mark.e2e
def test_a_killed_overwrite_is_recorded_beside_the_finished_run_it_leaves_as_it_was(tmp_path):
    sweep = tmp_path / "sweep"
    subprocess.run(_cli("-m", *TINY, "chunk=16", f"hydra.sweep.dir={sweep}"), capture_output=True, timeout=240,
                   check=True)
    before = {p.name: p.read_bytes() for p in (_job(sweep, 0)).iterdir() if p.is_file()}
    summary = (sweep / "sweep_summary.json").read_bytes()
    proc = subprocess.run(_cli("-m", *TINY, "chunk=16", "on_existing=overwrite", "hydra/launcher=submitit_local_safe",
                               "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={sweep}",
                               f"+hydra.callbacks.kill._target_={__name__}.SigkillJob", "+hydra.callbacks.kill.job=0",
                               "+hydra.callbacks.kill.beside=true"),
                          capture_output=True, text=True, timeout=240, check=False,
                          env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-2000:]
    assert {p.name: p.read_bytes() for p in (_job(sweep, 0)).iterdir() if p.is_file()} == before
    killed = json.loads((sweep / f".{_job(sweep, 0).name}.next" / "status.json").read_text())
    assert killed["status"] == "killed" and "SIGKILL" in killed["error"]
    # The finished sweep's report stays as it was too; the rerun's, which changed no job, goes beside it.
    assert (sweep / "sweep_summary.json").read_bytes() == summary
    assert json.loads((sweep / ".sweep_summary.next.json").read_text())[_job(sweep, 0).name] == \
        {"status": "killed", "error": killed["error"]}


def test_safe_launchers_are_the_plugins_configs_with_another_target():
    def launcher(name: str) -> dict:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
        return OmegaConf.to_container(cfg.hydra.launcher)

    for name in ("submitit_local", "submitit_slurm"):
        safe, plain = launcher(f"{name}_safe"), launcher(name)
        assert safe.pop("_target_") == plain.pop("_target_").replace("hydra_submitit_launcher", "sarathi_lab_launcher")
        assert safe == plain


def test_summary_tells_killed_jobs_and_ignores_earlier_sweeps(tmp_path):
    def job(name: str, status: str | None, age_s: float = 0.0) -> None:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").touch()
        if status:
            write_status(tmp_path / name, status, error="boom" if status == "failed" else None)
        if age_s:
            old = time.time() - age_s
            os.utime(tmp_path / name / ".hydra" / "config.yaml", (old, old))
            if status:
                record = json.loads((tmp_path / name / "status.json").read_text())
                (tmp_path / name / "status.json").write_text(json.dumps(record | {"time": old}))

    since = time.time() - 5
    job("0", "ok"), job("1", "failed"), job("2", "running"), job("3", None), job("4", "ok", age_s=3600)
    (tmp_path / "5").mkdir()  # killed before Hydra saved its config: only its launcher's status.json
    write_status(tmp_path / "5", "killed", error="SIGKILL")
    job("6", "ok", age_s=3600)  # a finished job of an earlier sweep, refused now: recorded beside it
    write_status(tmp_path / ".6.next", "failed", error="on_existing=refuse")
    summary = summarize_sweep(tmp_path, since)
    assert {k: v["status"] for k, v in summary.items()} == {"0": "ok", "1": "failed", "2": "killed", "3": "unknown",
                                                            "5": "killed", "6": "failed"}
    assert summary["1"]["error"] == "boom" and "killed" in summary["2"]["error"]


@pytest.mark.e2e
def test_sigterm_saves_partial_records_and_exits_with_the_signal(tmp_path):
    out = tmp_path / "run"
    # Long enough (minutes) that the signal lands mid-generate.
    proc = subprocess.Popen(_cli("experiment=smoke", "logger=none", "workload.num_requests=64", "seq_len=1024",
                                 "pd_ratio=1", f"hydra.run.dir={out}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    generating = threading.Event()

    def read() -> None:  # the run's first progress line says iterations ran, however loaded the machine
        for line in proc.stdout:
            lines.append(line)
            if "requests done" in line:
                generating.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert generating.wait(timeout=180), "".join(lines)[-2000:]
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        output = "".join(lines)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert _status(out) == "interrupted"
    assert not (out / "metrics.json").exists()
    record = json.loads((out / "metrics.partial.json").read_text())
    assert record["partial"] is True and record["summary"]["num_iterations"] > 0
    assert (out / "iterations.partial.parquet").exists() and (out / "requests.partial.parquet").exists()


def _status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def _wait_for(condition, timeout_s: float, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll_s)


def test_a_resumed_sweep_reports_a_job_refused_before_it_saved_its_config(tmp_path):
    # An earlier sweep's interrupted job 0 left its .hydra/ (and no metrics.json); resumed into the
    # same directory, job 0 is refused before it writes .hydra/ again: its status.json is this sweep's.
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "config.yaml").touch()
    old = time.time() - 3600
    os.utime(tmp_path / "0" / ".hydra" / "config.yaml", (old, old))
    since = time.time() - 5
    write_status(tmp_path / "0", "failed", error="engine.num_kv_blocks=1 is invalid")
    assert summarize_sweep(tmp_path, since) == {"0": {"status": "failed", "error": "engine.num_kv_blocks=1 is invalid"}}


@pytest.mark.e2e
def test_a_sweep_ends_with_a_table_of_its_jobs_in_folders_named_by_their_overrides(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(_cli("-m", *TINY, "chunk=16,32", "scheduler=sarathi,vllm", f"hydra.sweep.dir={sweep}"),
                          capture_output=True, text=True, timeout=240, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-2000:]
    names = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    # vllm reads no chunk: its second job would repeat its first; it runs once, and one line says so.
    assert names == [f"{n}_chunk={c},pd_ratio=5,scheduler={s},seq_len=48,workload.num_requests=2"
                     for n, (c, s) in enumerate([(16, "sarathi"), (16, "vllm"), (32, "sarathi")])]
    assert "chunk: scheduler=vllm does not read chunk (it prefills prompts whole): 1 job" in output
    table = pd.read_csv(sweep / "sweep_summary.csv")
    # The keys that differ between jobs, not those they share; how far to trust each row; metrics named
    # with their units.
    assert list(table.columns[:8]) == ["job", "status", "chunk", "scheduler", *TRUST]
    assert table.job.tolist() == names and table.status.eq("ok").all()
    assert table.chunk.tolist() == [16, 16, 32] and table.scheduler.tolist() == ["sarathi", "vllm", "sarathi"]
    assert table.source.eq("measured CPU").all() and table.kv_capacity_tokens.gt(0).all()
    assert table.timing_unreliable.tolist() == (table.runqueue_wait_share > 0.1).tolist()
    runs = load_runs(sweep).set_index("run_dir")
    for row in table.itertuples():
        assert row.total_throughput_tok_s == pytest.approx(runs.loc[str(sweep / row.job), "total_throughput_tok_s"])
    assert {"ttft_p50_s", "itl_p99_s", "request_throughput_rps"} <= set(table.columns)
    printed = output[output.index("sweep_summary.csv:"):].splitlines()
    assert printed[1].split()[:4] == ["job", "status", "chunk", "scheduler"] and printed[2].split()[:4] == [
        "0", "ok", "16", "sarathi"]


@given(st.integers(0, 10_000), st.text(max_size=400), st.text(max_size=400))
def test_job_folder_names_are_safe_bounded_and_unique(num, overrides, other):
    name = job_dir_name(num, overrides)
    assert len(name) <= MAX_NAME_CHARS and re.fullmatch(r"[A-Za-z0-9._=,+-]+", name)
    assert name.split("_", 1)[0] == str(num), "the job's number first: unique within a sweep, in launch order"
    assert job_dir_name(num + 1, overrides) != name
    if overrides != other:
        # Cut names keep a hash of the whole: two jobs whose overrides differ only past the cut stay apart.
        assert job_dir_name(num, other) != name or _same_once_sanitized(overrides, other)


def _same_once_sanitized(a: str, b: str) -> bool:
    # Different overrides that sanitize to the same text (e.g. "a/b" and "a:b") may share a name;
    # within one sweep the job number keeps them apart.
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", a) == re.sub(r"[^A-Za-z0-9._=,+-]", "_", b)


def test_a_job_folder_name_says_what_the_job_ran():
    assert job_dir_name(3, "chunk=256,scheduler=vllm") == "3_chunk=256,scheduler=vllm"
    assert job_dir_name(0, "") == "0"
    assert job_dir_name(1, "model.path=/data/../x y") == "1_model.path=_data_.._x_y"


def _finished_job(sweep: Path, job: str, overrides: list[str], environment: dict, summary: dict) -> None:
    (sweep / job).mkdir(parents=True)
    (sweep / job / "metrics.json").write_text(json.dumps({
        "config": {}, "overrides": overrides, "resolved_config": {}, "environment": environment,
        "summary": {"total_throughput_tok_s": 100.0} | summary}))


CPU = {"executor": "model", "simulated": False, "device": "cpu"}
SIM = {"executor": "sim", "simulated": True, "device": "sim:a100", "sim_device": "a100", "sim_cost_model": "calibrated",
       "sim_tp": 1, "timing_unreliable": False, "runqueue_wait_share": 0.4}


def test_the_sweep_table_says_how_far_to_trust_each_row(tmp_path):
    _finished_job(tmp_path, "0_scheduler=sarathi", ["scheduler=sarathi"],
                  CPU | {"timing_unreliable": True, "runqueue_wait_share": 0.23}, {"kv_capacity_tokens": 4096})
    _finished_job(tmp_path, "1_scheduler=vllm", ["scheduler=vllm"],
                  CPU | {"device": "cuda:0", "timing_unreliable": False, "runqueue_wait_share": 0.01},
                  {"kv_capacity_tokens": 11520})
    _finished_job(tmp_path, "2_scheduler=orca", ["scheduler=orca"], SIM, {"kv_capacity_tokens": 4096})
    jobs = {job: {"status": "ok", "error": None} for job in ("0_scheduler=sarathi", "1_scheduler=vllm",
                                                               "2_scheduler=orca")}
    jobs["3_scheduler=static"] = {"status": "failed", "error": "refused"}
    table = sweep_table(tmp_path, jobs)
    assert list(table.columns) == ["job", "status", "scheduler", *TRUST, "total_throughput_tok_s"]
    assert table.source.tolist()[:3] == ["measured CPU", "measured GPU", "simulated A100 (calibrated)"]
    assert table.timing_unreliable.tolist()[:3] == [True, False, False]
    # A simulated run's times come from a virtual clock: the host's waiting says nothing about them.
    assert table.runqueue_wait_share.tolist()[:2] == [0.23, 0.01] and pd.isna(table.runqueue_wait_share[2])
    assert table.kv_capacity_tokens.tolist()[:3] == [4096, 11520, 4096] and pd.isna(table.source[3])
    unreliable, kv, sources = table_notes(table)
    assert unreliable.startswith("timing unreliable: 1 of 3 runs (above 10% waiting; their threads waited for a CPU "
                                 "23% of the time they were ready)")
    assert kv.startswith("KV capacity differs between jobs: 4096 to 11520 tokens (2.8x; column kv_capacity_tokens)")
    assert "engine.num_kv_blocks" in kv
    assert sources.startswith("the rows come from different sources (measured CPU, measured GPU, simulated A100")


def test_a_sweep_of_comparable_rows_prints_no_note_under_its_table(tmp_path):
    for num, chunk in enumerate((256, 512)):
        _finished_job(tmp_path, f"{num}_chunk={chunk}", [f"chunk={chunk}"],
                      CPU | {"timing_unreliable": False, "runqueue_wait_share": 0.02}, {"kv_capacity_tokens": 4096})
    table = sweep_table(tmp_path, {f"{n}_chunk={c}": {"status": "ok", "error": None}
                                   for n, c in enumerate((256, 512))})
    assert table.chunk.tolist() == ["256", "512"] and table_notes(table) == []


def _composed(*overrides: str):
    """The primary config a sweep's callbacks and sweeper see, with ``overrides`` on its command line
    (inside initialize_config_dir, which the sweep's own composing of each job needs)."""
    cfg = compose(config_name="config", overrides=[o for o in overrides if "," not in o], return_hydra_config=True)
    with read_write(cfg), open_dict(cfg):
        cfg.hydra.overrides.task = list(overrides)  # as a multirun's command line leaves them
    return cfg


def test_a_swept_key_a_scheduler_ignores_runs_its_jobs_once_and_says_so():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = _composed("logger=none", "chunk=256,512", "scheduler=vllm,sarathi_serve")
        jobs, (note,) = swept_jobs(cfg)
        assert [job[1:] for job in jobs] == [["chunk=256", "scheduler=vllm"], ["chunk=256", "scheduler=sarathi_serve"],
                                             ["chunk=512", "scheduler=sarathi_serve"]]
        assert note == ("chunk: scheduler=vllm does not read chunk (it prefills prompts whole): 1 job that differed "
                        "only in chunk left out, run once at chunk=256; hydra.sweeper.repeat_ignored=true runs each")
        # Asked for, every job of the product runs (a paired baseline beside each run: experiment=pd_ratio).
        assert len(swept_jobs(_composed("hydra.sweeper.repeat_ignored=true", "chunk=256,512",
                                        "scheduler=vllm,sarathi_serve"))[0]) == 4
        # Keys every scheduler reads, and a task that times chunks itself, are never collapsed.
        assert swept_jobs(_composed("batch_size=2,4", "scheduler=vllm,sarathi"))[1] == []
        assert swept_jobs(_composed("task=profile", "chunk=64,128", "scheduler=vllm"))[1] == []


def test_a_declared_exclusion_leaves_its_jobs_out_and_says_so():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = _composed("logger=none", "workload.stagger=0,18", "scheduler=static,vllm,sarathi")
        with read_write(cfg), open_dict(cfg):  # as hydra.sweeper.exclude=[{...}] leaves it
            cfg.hydra.sweeper.exclude = [{"scheduler": ["static", "vllm"], "workload.stagger": 18}]
        jobs, notes = swept_jobs(cfg)
        assert [job[1:] for job in jobs] == [["workload.stagger=0", "scheduler=static"],
                                             ["workload.stagger=0", "scheduler=vllm"],
                                             ["workload.stagger=0", "scheduler=sarathi"],
                                             ["workload.stagger=18", "scheduler=sarathi"]]
        assert notes == ["hydra.sweeper.exclude[0]: 2 jobs of scheduler=static,vllm workload.stagger=18 left out"]


@pytest.mark.parametrize("rules, refused", [
    ("{chunk:64}", "hydra.sweeper.exclude={'chunk': 64} is invalid: allowed: a list of"),
    ("[chunk]", "hydra.sweeper.exclude[0]='chunk' is invalid: allowed: a mapping of swept keys"),
    ("[{}]", "hydra.sweeper.exclude[0]={} is invalid: allowed: a mapping of swept keys"),
    ("[{seed:1}]", "hydra.sweeper.exclude[0].seed is invalid: seed is not swept here; allowed: chunk, scheduler"),
    ("[{chunk:[64,99]}]", "hydra.sweeper.exclude[0].chunk=[64, 99] is invalid: the sweep's chunk takes 32, 64"),
])
def test_a_malformed_exclusion_is_refused_in_one_line_before_any_job_runs(tmp_path, rules, refused):
    # A rule that could match no job would leave nothing out, silently: a typo.
    proc = subprocess.run(_cli("-m", *TINY, "executor=sim", "chunk=32,64", "scheduler=vllm,sarathi",
                               f"hydra.sweeper.exclude={rules}", f"hydra.sweep.dir={tmp_path / 'sweep'}"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output and "Launching" not in output, output[-2000:]
    assert proc.stderr.splitlines() == [f"error: {proc.stderr.splitlines()[0][7:]}"], output
    assert refused in proc.stderr, output


@pytest.mark.e2e
def test_a_sweep_launches_none_of_the_jobs_its_exclusion_names(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(_cli("-m", *TINY, "executor=sim", "chunk=32,64", "scheduler=vllm,sarathi",
                               "hydra.sweeper.exclude=[{scheduler:sarathi,chunk:64}]", f"hydra.sweep.dir={sweep}"),
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-2000:]
    # vllm reads no chunk: once; sarathi at 64 excluded.
    assert "Launching 2 jobs" in output
    assert "hydra.sweeper.exclude[0]: 1 job of scheduler=sarathi chunk=64 left out" in output
    assert sorted(load_runs(sweep).scheduler) == ["sarathi", "vllm"] and set(load_runs(sweep).chunk) == {32}


def test_the_sweeper_composes_again_only_the_jobs_the_preflight_did_not(monkeypatch):
    # Hydra's sweeper composes every job before launching any; the preflight already did, with this loader.
    from types import SimpleNamespace

    from hydra_plugins.sarathi_lab_launcher.sweeper import Sweeper
    from sarathi_lab.harness import sweep_check

    composed = []
    loader = SimpleNamespace(load_sweep_config=lambda master_config, sweep_overrides: composed.append(sweep_overrides))
    monkeypatch.setitem(sweep_check._PARSED, "loader", loader)
    monkeypatch.setitem(sweep_check._PARSED, "jobs", {("chunk=256",): "parsed"})
    sweeper = Sweeper()
    sweeper.config, sweeper.hydra_context = OmegaConf.create({}), SimpleNamespace(config_loader=loader)
    sweeper.validate_batch_is_legal([["chunk=256"], ["chunk=512"]])
    assert composed == [["chunk=512"]]
    monkeypatch.setitem(sweep_check._PARSED, "loader", object())  # another loader's: composed again
    sweeper.validate_batch_is_legal([["chunk=256"]])
    assert composed == [["chunk=512"], ["chunk=256"]]


@pytest.mark.parametrize("overrides, key, why", [
    (["scheduler=vllm"], "chunk", "scheduler=vllm does not read chunk (it prefills prompts whole)"),
    (["scheduler=static"], "chunk", "scheduler=static does not read chunk (it prefills prompts whole)"),
    (["scheduler=orca"], "chunk", "scheduler=orca does not read chunk (it prefills prompts whole)"),
    (["scheduler=sarathi"], "chunk", None),
    (["scheduler=sarathi_serve"], "chunk", None),
    (["scheduler=sarathi_serve", "token_budget=auto", "slo.tbt_p99_s=0.1"], "chunk",
     "scheduler=sarathi_serve with token_budget=auto takes its budget from slo.tbt_p99_s"),
    (["scheduler=sarathi"], "token_budget", "scheduler=sarathi does not read token_budget"),
    (["scheduler=sarathi_serve"], "token_budget", None),
    (["scheduler=sarathi", "+scheduler.max_num_batched_tokens=64"], "scheduler.max_num_batched_tokens",
     "scheduler=sarathi has no knob max_num_batched_tokens"),
    (["scheduler=vllm"], "scheduler.max_num_batched_tokens", None),
    (["scheduler=vllm"], "batch_size", None),
    (["scheduler=vllm", "task=piggyback"], "chunk", None),
])
def test_what_a_job_ignores_comes_from_its_schedulers_config(overrides, key, why):
    from sarathi_lab.harness.schema import parse_config

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["logger=none", *overrides])
    assert parse_config(cfg).ignores(key) == why
