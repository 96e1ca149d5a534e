"""Real signals to real commands: SIGINT at any moment of a run's start-up ends it within seconds in
one line (it was a 70-line KeyboardInterrupt traceback, and now and then a signal start-up swallowed
and ran on from), exit 130, and leaves no run changed."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sarathi_lab.harness.interrupts import Interrupted, interruption_of, signals_interrupt
from sarathi_lab.harness.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize("delay_s", [0.15, 0.4, 0.8, 1.5, 2.5])
def test_sigint_during_start_up_is_one_line_and_no_traceback(delay_s, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.run", "executor=sim", "logger=none", "model=tiny",
                             f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 10
    assert "Traceback" not in out + err, err[-3000:]
    if proc.returncode == 0:
        return  # on an idle machine the run can be over before the signal lands
    # 128 + SIGINT, or ended by SIGINT itself (Python's own exit for a KeyboardInterrupt it did not
    # catch), which a shell reports as the same 130: either way one line and no traceback.
    assert proc.returncode in (128 + signal.SIGINT, -signal.SIGINT), err[-2000:]
    said = [line for line in (out + err).splitlines() if "interrupted" in line.lower()]  # a log line or stderr's
    assert len(said) == 1, (out + err)[-2000:]
    if "outside a run" in said[0]:
        assert not (tmp_path / "run" / "metrics.json").exists()


# Moments of a real engine run's start-up on the tiny model: Python and Hydra starting, the command
# line checked, torch imported, the kernels loaded, the model built ("running": once the run has
# marked itself running), the first iterations.
@pytest.mark.parametrize("delay_s", [0.3, 0.6, 0.9, 1.2, 1.8, 2.7, "running"])
def test_sigint_at_any_moment_of_a_real_runs_start_up_ends_it_in_one_line(delay_s, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.run", "experiment=smoke", "model=tiny", "logger=none",
                             f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if delay_s == "running":
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and '"running"' not in _read(tmp_path / "run"):
            time.sleep(0.01)
    else:
        time.sleep(delay_s)
    if proc.poll() is not None:
        proc.communicate()
        pytest.skip(f"the run was over within {delay_s} s, before the signal")
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    # A signal that start-up swallowed let the run go on to the end (exit 0): it must end it, at once.
    assert proc.returncode in (128 + signal.SIGINT, -signal.SIGINT), err[-2000:]
    assert time.monotonic() - sent < 10
    assert "Traceback" not in out + err, err[-3000:]
    said = [line for line in (out + err).splitlines() if "interrupted" in line.lower()]  # a log line or stderr's
    assert len(said) == 1, (out + err)[-2000:]
    status = tmp_path / "run" / "status.json"
    assert not status.exists() or json.loads(status.read_text())["status"] == "interrupted"
    assert not (tmp_path / "run" / "metrics.json").exists()


def _read(run_dir: Path) -> str:
    try:
        return (run_dir / "status.json").read_text()
    except OSError:
        return ""


def test_a_signal_whose_exception_a_finalizer_swallowed_ends_the_run_at_its_next_iteration(monkeypatch, capsys):
    # A signal's exception raised inside a finalizer (or an import lock's weakref callback) goes to
    # sys.unraisablehook and is lost: the run went on, and Python printed it with a traceback.
    others = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: others.append(unraisable.exc_type))

    class Finalized:
        def __init__(self, error: type[BaseException] | None = None):
            self.error = error

        def __del__(self) -> None:
            if self.error:
                raise self.error("not a signal")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here, and its exception goes to sys.unraisablehook

    progress = Progress(10, 1, lambda: None, interactive=False)
    with pytest.raises(Interrupted), signals_interrupt(signal.SIGINT):
        obj = Finalized()
        del obj
        obj = Finalized(ValueError)
        del obj
        assert others == [ValueError], "only what is not raised again reaches the earlier hook"
        progress(SimpleNamespace(num_tokens=1))
    progress(SimpleNamespace(num_tokens=1))  # the block over, nothing is left to raise
    assert "Traceback" not in capsys.readouterr().err


def test_a_run_is_recorded_interrupted_as_the_signal_lands_even_where_its_exception_is_swallowed(
        monkeypatch, tmp_path):
    # torch's import swallows a signal's exception now and then; the run went on until its first
    # iteration, and a sweep's parent, its grace over, killed it there: the status said `running`.
    from sarathi_lab import run
    from sarathi_lab.harness import runner
    from sarathi_lab.harness.cli_check import compose_config
    from sarathi_lab.harness.results import read_status, write_status

    seen = []

    def swallowing_run(cfg, resolved_config, ctx):
        write_status(ctx.status_dir, "running")
        with contextlib.suppress(Interrupted):  # as a library's bare except would
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        seen.append(read_status(ctx.status_dir))
        return "ok"

    monkeypatch.setattr(runner, "run_experiment", swallowing_run)
    ctx = runner.RunContext(output_dir=tmp_path, overrides=[], group=None, status_dir=tmp_path)
    run._run_and_record(compose_config(["executor=sim", "logger=none", "model=tiny"]), ctx)
    assert [(s["status"], s["error"]) for s in seen] == [("interrupted", "interrupted by SIGTERM")]


def test_the_block_gives_back_the_unraisable_hook_it_found():
    before = sys.unraisablehook
    with signals_interrupt(signal.SIGINT):
        assert sys.unraisablehook is not before
    assert sys.unraisablehook is before


def _jobs(sweep: Path) -> list[Path]:
    """The sweep's two job folders (<num>_<its overrides>), once Hydra has made both."""
    jobs = sorted(sweep.glob("[01]_*"))
    return jobs if len(jobs) == 2 else [sweep / "0", sweep / "1"]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_a_submitit_sweep_takes_its_jobs_down_and_records_them(signum, tmp_path):
    # Sent to the launching process alone (as `kill` or a scheduler does, not a terminal's Ctrl-C
    # to the whole group): its jobs ran on unsupervised, `running`, with no sweep_summary.json.
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=smoke", "logger=none",
                             "workload.num_requests=400", "seq_len=48", "pd_ratio=5", "chunk=16,32",
                             "hydra/launcher=submitit_local_safe", "hydra.launcher.timeout_min=10",
                             f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all(
            (job / "status.json").exists() and '"running"' in (job / "status.json").read_text()
            for job in _jobs(sweep)):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signum, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    time.sleep(1)
    assert _processes_mentioning(str(sweep)) == [], "the sweep's job processes outlived it"
    jobs = _jobs(sweep)
    for job in jobs:
        status = json.loads((job / "status.json").read_text())
        assert status["status"] == "interrupted", status
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert {j: s["status"] for j, s in summary.items()} == {job.name: "interrupted" for job in jobs}


def test_a_signal_once_every_run_is_over_ends_nothing_and_says_nothing(tmp_path):
    # The runs are recorded when main returns; a signal landing while the interpreter exits found
    # Python's default action back and ended the process silently with -2 (a finished run reported as
    # interrupted). Here main is a stand-in that returns at once, then the process signals itself.
    code = ("import os, signal, sys, time\n"
            "import sarathi_lab.run as run\n"
            "import sarathi_lab.harness.cli_check as check\n"
            "check.check_command_line = lambda args: None\n"
            "check.output_dir_problem = lambda args: None\n"
            "check.sweep_note = lambda args: None\n"
            "run.main = lambda: None\n"
            "sys.argv = ['run', 'logger=none']\n"
            "run.cli()\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(0.2)\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_signal_after_a_run_is_recorded_but_before_it_returns_ends_nothing(tmp_path):
    # A single run's last steps once its status is written (releasing its folder, Hydra's own ending):
    # a signal there said "no run was started or changed" of a run that was, and exited 130.
    code = ("import os, signal, sys, time\n"
            "from sarathi_lab.harness import runner\n"
            "release = runner.RunContext.release\n"
            "def signalled(self):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(0.2)\n"
            "    release(self)\n"
            "runner.RunContext.release = signalled\n"
            "import sarathi_lab.run as run\n"
            f"sys.argv = ['run', 'executor=sim', 'model=tiny', 'logger=none', 'hydra.run.dir={tmp_path}/run']\n"
            "run.cli()\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "interrupted" not in (done.stdout + done.stderr).lower()
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "ok"


def test_a_signal_landing_where_a_class_is_built_is_still_the_signal():
    # A job interrupted while a module imported (a dataclass field's __set_name__) was recorded as
    # failed with "RuntimeError: Error calling __set_name__": Python 3.11 wraps the exception there.
    class Field:
        def __set_name__(self, owner, name):
            raise Interrupted(signal.SIGTERM)

    with pytest.raises(BaseException) as caught:
        type("Built", (), {"field": Field()})
    assert interruption_of(caught.value).signum == signal.SIGTERM
    assert interruption_of(ValueError("not a signal")) is None
