"""A kept lease's files are read by one reader (analysis/gpu_records.py, gpu_tables.py) in every
command that reads them: a field missing, not finite, not positive where physical, or of the wrong
kind is refused in one `error:` line naming the file and the field, before anything is written; a
FIFO or an oversized file is refused without being read; a lease's text reaches a page as plain
text. Each case damages a copy of a synthetic lease and starts the command's entry point."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sarathi_lab.analysis import attribute, gpu_records
from sarathi_lab.measure.gpu import collect
from sarathi_lab.measure.sim_check import floor_claims, sim_fidelity
from tests.test_attribution import step_record, synthetic_lease
from tests.test_suite_records import _archive

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _lease(tmp_path: Path) -> Path:
    return synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")


def _refusal(main, argv: list[str]) -> str:
    """The one `error:` line ``main(argv)`` exits 2 with."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as e:
        main(argv)
    lines = [line for line in err.getvalue().splitlines() if not line.startswith("warning: ")]
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err.getvalue()
    return lines[0]


def _env(folder: Path, **values) -> None:
    path = folder / "steps" / "env" / "env.json"
    record = json.loads(path.read_text()) | values
    path.write_text(json.dumps({k: v for k, v in record.items() if v is not ...}))


def _csv(path: Path, change=lambda row: None, drop: str | None = None) -> None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    change(rows[0])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, [c for c in rows[0] if c != drop], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _launch(folder: Path, change) -> None:
    path = folder / "steps" / "launch" / "result.json"
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


TUNE, ATTENTION = "steps/tune/tune_gemm.csv", "steps/attention/attention.csv"
# damage -> (the file named, the field named)
DAMAGES = {
    "matmul_tflops 0": (lambda f: _env(f, matmul_tflops=0), "env.json", "matmul_tflops=0"),
    "matmul_tflops missing": (lambda f: _env(f, matmul_tflops=...), "env.json", "matmul_tflops is missing"),
    "matmul_tflops a word": (lambda f: _env(f, matmul_tflops="fast"), "env.json", "matmul_tflops='fast'"),
    "a negative rate": (lambda f: _env(f, matmul_tflops=-800.0), "env.json", "matmul_tflops=-800.0"),
    "an infinite copy rate": (lambda f: _env(f, copy_gbps=float("inf")), "env.json", "copy_gbps=inf"),
    "no memory rate": (lambda f: _env(f, copy_gbps=...), "env.json", "read_gbps and copy_gbps are missing"),
    "ms column missing": (lambda f: _csv(f / TUNE, drop="ms"), "tune_gemm.csv", "no column 'ms'"),
    "ms a word": (lambda f: _csv(f / TUNE, lambda r: r.update(ms="slow")), "tune_gemm.csv", "line 2, ms='slow'"),
    "ms NaN": (lambda f: _csv(f / TUNE, lambda r: r.update(ms="nan")), "tune_gemm.csv", "line 2, ms='nan'"),
    "ms negative": (lambda f: _csv(f / TUNE, lambda r: r.update(ms="-0.08")), "tune_gemm.csv", "ms='-0.08'"),
    "ms infinite": (lambda f: _csv(f / TUNE, lambda r: r.update(ms="inf")), "tune_gemm.csv", "ms='inf'"),
    "heads column missing": (lambda f: _csv(f / ATTENTION, drop="heads"), "attention.csv", "no column 'heads'"),
    "a kernel time negative": (lambda f: _csv(f / ATTENTION, lambda r: r.update(engine_ms="-0.02")),
                               "attention.csv", "line 2, engine_ms='-0.02'"),
    "an iteration time negative": (
        lambda f: _launch(f, lambda r: r["metrics"][0].update(value=-22.0)), "launch/result.json",
        "metrics[0].value (engine_ms[c=256+b=17])=-22.0"),
    "a launch result of the wrong shape": (
        lambda f: _launch(f, lambda r: r.update(metrics={"engine_ms[b=18]": 15.0})), "launch/result.json",
        "metrics={'engine_ms[b=18]': 15.0}: must be a list of metrics"),
    "a lease record of another folder": (
        lambda f: (f / "lease.json").write_text(json.dumps(json.loads((f / "lease.json").read_text())
                                                           | {"lease": "2026-10-01_abc1234"})),
        "lease.json", "lease='2026-10-01_abc1234'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_lease_field_is_refused_naming_its_file_and_field(damage, tmp_path):
    folder = _lease(tmp_path)
    make, file, field = DAMAGES[damage]
    make(folder)
    line = _refusal(attribute.main, [str(folder)])
    assert f"{file} is invalid: " in line and field in line, line
    assert not list(folder.parent.glob("*.attribution.*"))


def test_a_fifo_in_place_of_a_lease_file_is_refused_never_waited_on(tmp_path):
    folder = _lease(tmp_path)
    env = folder / "steps" / "env" / "env.json"
    env.unlink()
    os.mkfifo(env)
    # A fresh interpreter with a deadline: a reader that opens the FIFO waits for a writer forever.
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "attribute", str(folder)], env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: {env} is invalid: not a regular file"], done.stderr


def test_a_lease_file_over_the_suite_s_cap_is_refused_unread(tmp_path):
    folder = _lease(tmp_path)
    env = folder / "steps" / "env" / "env.json"
    with open(env, "r+b") as f:
        f.truncate(gpu_records.MAX_FILE_BYTES + 1)  # sparse: its size, not its bytes
    line = _refusal(attribute.main, [str(folder)])
    assert line == (f"error: {env} is invalid: {gpu_records.MAX_FILE_BYTES + 1} bytes, more than the 16 MiB "
                    "of any file the suite writes")


def test_a_claim_s_text_reaches_the_attribution_page_as_plain_text(tmp_path):
    folder = _lease(tmp_path)
    hostile = 'Chunks <img src=x onerror="alert(1)"> keep it [see](javascript:alert(1)) <https://x.example>'
    claims = folder / "claims.csv"
    claims.write_text(claims.read_text().replace("Chunks of 256 keep it", hostile))
    with contextlib.redirect_stdout(io.StringIO()):
        assert attribute.main([str(folder)]) == 0
    page = (folder.parent / f"{folder.name}.attribution.md").read_text()
    assert "<img" not in page and "<https:" not in page and "[see](" not in page
    assert "&lt;img src=x onerror=\"alert(1)\"> keep it \\[see\\](javascript:alert(1))" in page


def test_floor_claims_reads_the_lease_through_the_same_reader(tmp_path):
    folder = _lease(tmp_path)
    (folder / "claims.csv").write_text("experiment,holds\nchunk_overhead,no\n")
    line = _refusal(floor_claims.main, [str(folder)])
    assert f"{folder / 'claims.csv'} is invalid: its header ['experiment', 'holds'] lacks 'claim'" in line
    assert not list(folder.parent.glob("*.floor_claims.csv"))


def test_sim_fidelity_refuses_a_damaged_kept_launch_result_before_its_work(tmp_path, monkeypatch):
    gpu = tmp_path / "gpu"
    folder = synthetic_lease(gpu / "h100" / "2026-11-01_abc1234")
    (folder / "steps" / "launch" / "result.json").write_text(json.dumps(step_record("launch", [
        {"metric": "engine_ms[b=1]", "value": float("nan")}])))
    monkeypatch.setattr(sim_fidelity, "GPU_DOCS", gpu)
    line = _refusal(sim_fidelity.main, ["--smoke", "--out", str(tmp_path / "out")])
    assert "launch/result.json is invalid: metrics[0].value (engine_ms[b=1])=nan: must be a time in ms" in line
    assert not (tmp_path / "out").exists()


def test_collect_refuses_an_archive_whose_env_rates_are_not_physical(tmp_path):
    archive = _archive(tmp_path / "suite.tar.gz", **{"steps/env/env.json": json.dumps(
        {"device": "NVIDIA H100 80GB HBM3", "copy_gbps": 3000.0, "matmul_tflops": 0}).encode()})
    line = _refusal(collect.main, [str(archive), "--root", str(tmp_path / "repo")])
    assert "steps/env/env.json is invalid: matmul_tflops=0: must be a rate in TFLOP/s" in line
    assert not (tmp_path / "repo").exists()


def test_every_kept_lease_s_env_passes_the_reader():
    for kept in gpu_records.kept_leases(ROOT / "docs" / "gpu"):
        env = gpu_records.read_env(kept.folder / "steps" / "env")
        assert env["matmul_tflops"] > 0 and (env.get("read_gbps") or env["copy_gbps"]) > 0
