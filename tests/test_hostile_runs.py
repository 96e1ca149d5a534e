"""Hostile locks, sidecars, resumed and skipped runs, claims readers and boolean environment variables:
a sweep's lock never follows a link nor truncates another file, and one it cannot take refuses the sweep
in one line; a run's identity includes its trace's path and content; a resumed sweep's stale jobs are set
aside and no reader reads them; claims say which runs lack a metric and which commits they mix, and
never raise a raw KeyError; SARATHI_INCLUDE_INCOMPLETE=true counts and =maybe is refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from sarathi_lab import provenance
from sarathi_lab.analysis import claims
from sarathi_lab.analysis.runs import INCLUDE_INCOMPLETE_ENV, Results
from sarathi_lab.config import ConfigError
from sarathi_lab.env_flags import FALSE, TRUE, EnvFlagError, env_flag, parse_flag
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.results import load_runs
from sarathi_lab.harness.sweep import STALE, SweepSummary, move_stale
from sarathi_lab.harness.sweep_state import SWEEP_LOCK, LockRefused, hold, sweep_state

ROOT = Path(__file__).resolve().parents[1]


# --- boolean environment variables -------------------------------------------------------------------

@given(word=st.sampled_from(TRUE + FALSE), upper=st.lists(st.booleans(), max_size=5), pad=st.sampled_from(["", " "]))
def test_every_usual_spelling_of_yes_and_no_is_read(word, upper, pad):
    spelled = "".join(c.upper() if i < len(upper) and upper[i] else c for i, c in enumerate(word))
    assert parse_flag("SARATHI_X", pad + spelled + pad) is (word in TRUE)


@given(value=st.text(min_size=1, max_size=12).filter(lambda v: v.strip() and v.strip().lower() not in TRUE + FALSE))
def test_any_other_value_is_refused_in_one_line_naming_the_variable(value):
    with pytest.raises(EnvFlagError) as refused:
        parse_flag("SARATHI_X", value)
    message = str(refused.value)
    assert message.startswith("SARATHI_X=") and "1, true, yes, on" in message and "\n" not in message


def test_results_read_include_incomplete_as_the_usual_spellings_say(tmp_path, monkeypatch):
    for value, expected in (("true", True), ("YES", True), ("on", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv(INCLUDE_INCOMPLETE_ENV, value)
        assert Results(tmp_path).include_incomplete is expected, value
    monkeypatch.setenv(INCLUDE_INCOMPLETE_ENV, "maybe")
    with pytest.raises(EnvFlagError, match=f"^{INCLUDE_INCOMPLETE_ENV}='maybe' is invalid"):
        Results(tmp_path)
    monkeypatch.delenv(INCLUDE_INCOMPLETE_ENV)
    assert env_flag(INCLUDE_INCOMPLETE_ENV, default=True) is True


def test_publish_refuses_a_flag_it_cannot_read_in_one_line(tmp_path, capsys, monkeypatch):
    from sarathi_lab.analysis import publish

    monkeypatch.setenv(INCLUDE_INCOMPLETE_ENV, "2")
    with pytest.raises(SystemExit) as exit_:
        publish.main(["--sim", str(tmp_path), "--docs", str(tmp_path / "docs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: {INCLUDE_INCOMPLETE_ENV}='2'")


# --- the sweep's lock ----------------------------------------------------------------------------------

def _hostile_lock(sweep: Path, kind: str, victim: Path) -> None:
    sweep.mkdir(parents=True)
    lock = sweep / SWEEP_LOCK
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(victim.with_name("not-yet"))
    elif kind == "directory":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "hard link":
        os.link(victim, lock)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "directory", "fifo", "hard link"])
def test_a_lock_that_is_not_the_sweeps_own_file_refuses_the_sweep_and_is_left_as_it_was(kind, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    sweep = tmp_path / "sweep"
    _hostile_lock(sweep, kind, victim)
    with pytest.raises(LockRefused, match=rf"^hydra.sweep.dir={sweep} cannot be locked: .*{SWEEP_LOCK}"):
        hold(sweep, jobs=2)
    assert victim.read_text() == "precious" and not victim.with_name("not-yet").exists()
    # Reading the sweep's state never follows the link nor waits on the FIFO either.
    reader = threading.Thread(target=sweep_state, args=(sweep,), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode says")
def test_an_unwritable_lock_refuses_the_sweep(tmp_path):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / SWEEP_LOCK).write_text("{}")
    (tmp_path / "sweep" / SWEEP_LOCK).chmod(0o444)
    with pytest.raises(LockRefused, match="cannot be written"):
        hold(tmp_path / "sweep", jobs=1)


def test_a_sweep_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for sweep in (tmp_path / "file", tmp_path / "file" / "sweep"):
        with pytest.raises(LockRefused, match=rf"^hydra.sweep.dir={sweep} is invalid: .*not a directory"):
            hold(sweep, jobs=1)
    assert (tmp_path / "file").read_text() == "x"


def test_the_sweep_callback_turns_a_lock_it_cannot_take_into_one_error_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _hostile_lock(sweep, "directory", tmp_path / "victim")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "sweeper": {"_target_": "other.Sweeper"}}})
    with pytest.raises(SystemExit) as exit_:
        SweepSummary().on_multirun_start(config)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: hydra.sweep.dir=")


# --- sidecars ---------------------------------------------------------------------------------------

def test_a_sidecar_that_is_not_a_plain_file_is_refused_forced_or_not_before_anything_is_written(tmp_path):
    prov = provenance.Provenance("computed")
    target = tmp_path / "docs" / "table.csv"
    (tmp_path / "docs" / provenance.SIDECAR).mkdir(parents=True)
    for force in (False, True):
        with pytest.raises(provenance.ReplaceRefused, match="provenance.json is not a plain file"):
            provenance.check({target: prov}, force, "--force replaces them")
    (tmp_path / "docs" / provenance.SIDECAR).rmdir()
    (tmp_path / "docs" / provenance.SIDECAR).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(provenance.ReplaceRefused, match="not a plain file"):
        provenance.check({target: prov}, True, "--force replaces them")
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == [provenance.SIDECAR]


def test_recording_into_a_folder_it_cannot_replace_the_sidecar_of_leaves_no_temp_file(tmp_path):
    (tmp_path / provenance.SIDECAR).mkdir()
    with pytest.raises(OSError):
        provenance.record_folder(tmp_path, {"x.csv": provenance.Provenance("computed")})
    assert [p.name for p in tmp_path.iterdir()] == [provenance.SIDECAR]


# --- skipped runs: a run's identity includes its trace ------------------------------------------------

TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,20,3\n0.1,30,4\n"
RUN = ["experiment=smoke", "logger=none", "executor=sim", "workload=trace", "workload.path=trace.csv",
       "workload.num_requests=2", "on_existing=skip"]


def test_skip_keeps_no_run_of_an_edited_trace_nor_of_another_file_at_the_same_relative_path(tmp_path, monkeypatch):
    here, there, run = tmp_path / "here", tmp_path / "there", tmp_path / "run"
    for folder, text in ((here, TRACE), (there, TRACE.replace("30,4", "31,4"))):
        folder.mkdir()
        (folder / "trace.csv").write_text(text)
    monkeypatch.chdir(here)
    assert run_in_process(RUN, run) == "ok"
    inputs = json.loads((run / "metrics.json").read_text())["inputs"]
    assert inputs["workload.path_resolved"] == str((here / "trace.csv").resolve())
    assert len(inputs["workload.sha256"]) == 64
    assert run_in_process(RUN, run) == "skipped"
    monkeypatch.chdir(there)  # the same workload.path, another file
    with pytest.raises(ConfigError, match=r"holds a finished run of another config \(workload.path_resolved: "):
        run_in_process(RUN, run)
    monkeypatch.chdir(here)
    (here / "trace.csv").write_text(TRACE + "0.2,10,2\n")  # edited since
    with pytest.raises(ConfigError, match=r"holds a finished run of another config \(workload.sha256: "):
        run_in_process(RUN, run)
    record = json.loads((run / "metrics.json").read_text())
    del record["inputs"]  # a run recorded before runs recorded their inputs: whose trace is unknown
    (run / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"\(workload.path_resolved: unrecorded -> "):
        run_in_process(RUN, run)


def test_a_relative_hf_checkpoint_is_known_by_its_absolute_folder(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sarathi_lab.harness.runner import run_inputs

    monkeypatch.chdir(tmp_path)
    cfg = SimpleNamespace(model=SimpleNamespace(name="hf", path="ckpt"), workload=SimpleNamespace(kind="synthetic"))
    assert run_inputs(cfg) == {"model.path_resolved": str(tmp_path.resolve() / "ckpt")}


# --- resumed sweeps and the claims' readers -------------------------------------------------------------

def _run(job: Path, summary: dict, commit: str = "abc1234def") -> None:
    job.mkdir(parents=True)
    (job / "metrics.json").write_text(json.dumps({
        "summary": summary, "config": {"model": "tiny", "seed": 0, "chunk": int(job.name.split("=")[-1])},
        "environment": {"device": "cpu", "dtype": "float32", "device_name": "Test CPU", "torch_threads": 1,
                        "git_commit": commit},
        "overrides": [], "resolved_config": {"engine": {"executor": "model"}}, "partial": False, "wall_time_s": 1.0}))


def _sweep(root: Path, chunks, summaries=None, commits=None) -> Path:
    sweep = root / "pd_ratio" / "multiruns" / "2026-01-01_00-00-00"
    for i, chunk in enumerate(chunks):
        _run(sweep / f"{i}_chunk={chunk}", (summaries or {}).get(chunk, {"ttft_p50_s": 0.1 * (i + 1)}),
             (commits or {}).get(chunk, "abc1234def"))
    return sweep


def test_stale_jobs_are_moved_aside_named_and_read_by_no_reader(tmp_path, caplog):
    sweep = _sweep(tmp_path, [32, 64, 128])  # the first launch's jobs
    (sweep / "1_chunk=128").mkdir()  # the second launch's (chunk=32,128) second job
    _run(sweep / "1_chunk=128" / "x=1", {"ttft_p50_s": 1.0})
    moved = move_stale(sweep, {"0_chunk=32", "1_chunk=128"})
    assert moved == ["1_chunk=64", "2_chunk=128"] and "1_chunk=64, 2_chunk=128" in caplog.text
    assert sorted(p.name for p in next((sweep / STALE).iterdir()).iterdir()) == moved
    assert sorted(Path(d).relative_to(sweep).parts[0] for d in load_runs(sweep).run_dir) == ["0_chunk=32",
                                                                                            "1_chunk=128"]


def test_readers_read_only_the_jobs_a_finished_sweeps_report_lists(tmp_path, caplog):
    sweep = _sweep(tmp_path, [32, 64, 128])
    (sweep / "sweep_summary.json").write_text(json.dumps({"0_chunk=32": {"status": "ok"},
                                                          "2_chunk=128": {"status": "ok"}}))
    summary = Results(tmp_path).summary("pd_ratio")
    assert sorted(summary.chunk) == [32, 128] and "1_chunk=64" in caplog.text


def _check(results) -> list[dict]:
    ttft = results.summary("pd_ratio")["ttft_p50_s"].dropna()
    return [claims.claim_row("pd_ratio", "ttft is low", "low", f"{ttft.mean():.2f}", "yes", ttft.mean())]


def test_claims_say_which_runs_lack_a_metric_and_never_raise_a_raw_key_error(tmp_path):
    _sweep(tmp_path, [32, 64, 128], summaries={64: {"ttft_median_s": 0.2}})  # renamed in one run
    row = claims.rows_of(_check, Results(tmp_path), "pd_ratio")[0]
    assert row["holds"] == "yes" and "1 of 3 runs lack ttft_p50_s" in row["left out"]
    every = tmp_path / "every"
    _sweep(every, [32, 64], summaries={c: {"ttft_median_s": 0.2} for c in (32, 64)})  # renamed in every run
    rows = claims.rows_of(_check, Results(every), "pd_ratio")
    assert len(rows) == 1 and rows[0]["holds"] == "n/a" and "ttft_p50_s" in rows[0]["ours"]
    assert "none has ttft_p50_s" in rows[0]["left out"]


def test_claims_and_figure_titles_name_the_commits_their_runs_mix(tmp_path):
    _sweep(tmp_path, [32, 64, 128], commits={128: "fedcba9876"})
    results = Results(tmp_path)
    row = claims.rows_of(_check, results, "pd_ratio")[0]
    assert row["commit"] == "mixed: abc1234 (2 runs), fedcba9 (1 run)"
    assert "runs of abc1234 (2 runs), fedcba9 (1 run)" in results.describe("pd_ratio")
    single = tmp_path / "single"
    _sweep(single, [32])
    assert claims.rows_of(_check, Results(single), "pd_ratio")[0]["commit"] == "abc1234"


@pytest.mark.e2e
def test_a_real_sweep_resumed_with_other_swept_values_sets_the_old_jobs_aside(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    sweep = tmp_path / "sweep"

    def launch(chunks: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=smoke", "executor=sim",
                               "logger=none", f"chunk={chunks}", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    assert launch("32,64,128").returncode == 0
    second = launch("32,128")
    said = second.stdout + second.stderr
    assert second.returncode == 0, said[-3000:]
    assert "moved aside" in said and "1_chunk=64" in said
    assert sorted(load_runs(sweep).chunk) == [32, 128]
    assert sorted(json.loads((sweep / "sweep_summary.json").read_text())) == ["0_chunk=32,executor=sim",
                                                                             "1_chunk=128,executor=sim"]


def test_claims_say_a_run_they_cannot_read_is_left_out(tmp_path):
    sweep = _sweep(tmp_path, [32, 64])
    (sweep / "1_chunk=64" / "metrics.json").write_text('{"summary": ')  # cut short
    results = Results(tmp_path)
    row = claims.rows_of(_check, results, "pd_ratio")[0]
    assert "1 run unreadable (1_chunk=64): left out" in row["left out"]
    assert "1 run unreadable" in results.describe("pd_ratio")


def test_claims_and_titles_read_runs_whose_environment_lacks_fields(tmp_path):
    sweep = _sweep(tmp_path, [32])
    record = json.loads((sweep / "0_chunk=32" / "metrics.json").read_text())
    record["environment"] = {}  # recorded by a version that kept none of it
    (sweep / "0_chunk=32" / "metrics.json").write_text(json.dumps(record))
    results = Results(tmp_path)
    row = claims.rows_of(_check, results, "pd_ratio")[0]
    assert row["holds"] == "yes" and row["commit"] == provenance.UNRECORDED
    assert "unrecorded device" in results.describe("pd_ratio")


def test_a_sweep_whose_runs_ran_at_two_commits_says_so(tmp_path):
    from sarathi_lab.harness.sweep import mixed_commits

    sweep = _sweep(tmp_path, [32, 64, 128], commits={128: "fedcba9876"})
    jobs = {p.name: {"status": "ok"} for p in sweep.iterdir()}
    assert mixed_commits(sweep, jobs).startswith("the runs come from 2 commits: abc1234 (2 jobs), fedcba9 (1 job)")
    assert mixed_commits(_sweep(tmp_path / "one", [32, 64]), {"0_chunk=32": {}, "1_chunk=64": {}}) is None


def test_a_fifo_where_a_run_or_a_report_is_expected_is_left_out_without_waiting(tmp_path):
    sweep = _sweep(tmp_path, [32])
    os.mkfifo(sweep / "sweep_summary.json")
    (sweep / "1_chunk=64").mkdir()
    os.mkfifo(sweep / "1_chunk=64" / "metrics.json")
    found = {}
    reader = threading.Thread(target=lambda: found.update(runs=load_runs(sweep), state=sweep_state(sweep)),
                              daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive() and len(found["runs"]) == 1
