"""Filesystem faults end in one line naming the path, exit 2 (the command's fault) or 1 (the
machine's), with no traceback and nothing finished changed. Real faults, each in a fresh interpreter
as a user meets them: a read-only tmpfs mount (we may be root, whom chmod does not stop), a full
tmpfs, a real symlink to a finished run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ["logger=none", "executor=sim", "model=tiny"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "sarathi_lab.run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _mount(where: Path, options: str) -> None:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                          check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): no real read-only or full filesystem")


@pytest.fixture
def mounted(tmp_path):
    mounts = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        _mount(where, options)
        mounts.append(where)
        return where
    yield mount
    for where in mounts:
        subprocess.run(["umount", str(where)], check=False)


def _errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower()]


def test_a_read_only_working_directory_is_refused_in_one_line(mounted):
    ro = mounted("ro", "ro")
    done = _run(SIM, cwd=ro)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: hydra.run.dir=") \
        and f"{ro}, where it would be created, is read-only" in done.stderr, done.stderr


def test_an_output_dir_on_a_read_only_filesystem_is_refused_in_one_line(mounted, tmp_path):
    ro = mounted("ro", "ro")
    done = _run([*SIM, "-m", "chunk=32,64", f"hydra.sweep.dir={ro}/sweep"], cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "hydra.sweep.dir=" in done.stderr, done.stderr


def test_a_full_disk_stops_the_run_in_one_line_with_nothing_half_written(mounted, tmp_path):
    full = mounted("full", "size=60k")
    done = _run([*SIM, "workload.num_requests=300", f"hydra.run.dir={full}/run"], cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert [e for e in _errors(done) if "No space left on device" in e and "nothing half-written" in e], done.stderr
    assert not (full / "run" / "metrics.json").exists()
    assert not [p for p in (full / "run").iterdir() if p.name.endswith(".tmp") or ".tmp" in p.name]


@pytest.mark.slow
def test_overwrite_through_a_symlinked_run_directory_replaces_the_run_where_the_link_points(tmp_path):
    real = tmp_path / "real" / "run"
    first = _run([*SIM, f"hydra.run.dir={real}"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = json.loads((real / "metrics.json").read_text())
    link = tmp_path / "latest"
    link.symlink_to(real, target_is_directory=True)
    done = _run([*SIM, "seed=1", "on_existing=overwrite", f"hydra.run.dir={link}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert link.is_symlink() and link.resolve() == real.resolve()
    after = json.loads((real / "metrics.json").read_text())
    assert after["resolved_config"]["seed"] == 1 and before["resolved_config"]["seed"] != 1
    assert json.loads((real / "status.json").read_text())["status"] == "ok"
    assert sorted(p.name for p in real.parent.iterdir()) == ["run"], "the swap left something beside the run"


def test_tables_that_cannot_all_be_written_leave_neither_tables_nor_a_metrics_json(tmp_path, monkeypatch):
    import errno

    import pandas as pd

    from sarathi_lab.harness import results

    real, calls = results._write_parquet, []

    def full_at_second(table, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(table, path)

    monkeypatch.setattr(results, "_write_parquet", full_at_second)
    table = pd.DataFrame({"iteration": [0, 1]})
    record = results.RunResult({}, {}, {}, [], {}, partial=False, wall_time_s=1.0)
    with pytest.raises(OSError, match="No space left"):
        results.write_results(tmp_path, {"iterations": table, "requests": table}, record)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # was: iterations.parquet left, half a result


def test_a_run_on_a_full_disk_is_recorded_failed_with_the_reason_never_running(tmp_path, monkeypatch):
    import errno

    from sarathi_lab.harness import results
    from sarathi_lab.harness.runner import record_failure

    results.write_status(tmp_path, "running")

    def no_room(path, write):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(results, "write_atomically", no_room)  # not even a status.json beside the old one
    record_failure(tmp_path, OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.parquet")))
    status = json.loads((tmp_path / results.STATUS).read_text())
    assert status["status"] == "failed" and "No space left on device" in status["error"]  # was: running


def test_a_run_past_its_file_size_limit_is_failed_without_a_metrics_json(tmp_path):
    # ulimit -f with SIGXFSZ ignored: every write past the limit fails with EFBIG.
    import resource
    import signal

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *SIM, "workload.num_requests=300",
                           f"hydra.run.dir={run}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False, preexec_fn=limited)
    assert done.returncode == 1, done.stderr[-2000:]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "File too large" in status["error"]
    assert not (run / "metrics.json").exists() and not list(run.glob("*.parquet"))
