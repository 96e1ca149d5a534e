"""The GPU suite's own files (lease.json, summary.json, step result.json, claims.csv) checked against one
schema where they are read (analysis/gpu_records.py): a damaged one is a one-line error naming the file
and field, or a lease skipped with a warning, never a traceback; collect writes a lease all or nothing;
a lease's text in RESULTS.md is plain text that cannot end its section."""
from __future__ import annotations

import contextlib
import copy
import errno
import io
import json
import os
import re
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab import output_files
from sarathi_lab.analysis import gpu_claims, gpu_records
from sarathi_lab.measure.gpu import archive_members, collect, queue, state, suite
from sarathi_lab.measure.gpu.plan import STEPS

STARTED = 1_790_000_000.0  # 2026-09-21
METRIC = {"metric": "x_ms", "value": 1.5, "unit": "ms", "target": "", "holds": None}
RESULT = {"step": "env", "status": "done", "started_at": STARTED, "seconds": 3.0, "metrics": [METRIC],
          "notes": ["seed=0"], "error": "", "commit": "abc1234", "device": "cuda", "code": ""}
SUMMARY = {"suite": {"dry_run": False, "commit": "abc1234", "budget_min": 9.0, "started": "x", "own": False},
           "steps": [RESULT]}
LEASE = {"device": "h200", "machine": "NVIDIA H200", "lease": "2026-09-21_abc1234", "commit": "abc1234",
         "steps_done": ["env"], "steps_not_done": {}, "engine": "eager", "profiles": []}
CLAIMS = "experiment,claim,paper,ours,spread,holds\ndecode_speedup,{claim},2.8x,3x,none,yes\n"


def _keep(gpu: Path, lease: dict, summary=SUMMARY, claim: str = "gain") -> Path:
    folder = gpu / lease["device"] / lease["lease"]
    folder.mkdir(parents=True)
    (folder / "lease.json").write_text(json.dumps(lease))
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "claims.csv").write_text(CLAIMS.format(claim=claim))
    return folder


def _archive(path: Path, summary=SUMMARY, result=RESULT, **raw: bytes) -> Path:
    files = {"steps/env/env.json": {"device": "NVIDIA H100 80GB HBM3"}, "summary.json": summary,
             "steps/env/result.json": result, **raw}
    with tarfile.open(path, "w:gz") as tar:
        for name, record in files.items():
            data = record if isinstance(record, bytes) else json.dumps(record).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _one_line_or_none(call) -> str | None:
    """What ``call`` (a command's main) said: None where it succeeded, else its one error line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            call()
            return None
        except SystemExit as e:
            assert e.code == 2, err.getvalue()
    errors = [line for line in err.getvalue().splitlines() if not line.startswith("warning: ")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in err.getvalue(), err.getvalue()
    return errors[0]


def test_the_kept_leases_and_the_h100_archive_pass_the_schema():
    root = Path(__file__).resolve().parents[1]
    kept = gpu_records.kept_leases(root / "docs" / "gpu")
    assert {k.folder.name for k in kept} >= {"2026-11-26_27958ff", "2026-11-27_7fae342", "2026-11-27_9e2ae41"}
    for k in kept:
        for path in (k.folder / "steps").glob("*/result.json"):
            gpu_records.read(path, gpu_records.step_result)
        gpu_records.read_claims(k.folder / "claims.csv")


# Each: a damaged field, and the field its one line must name.
REFUSED = {
    "a list where a mapping belongs": (lambda s: s | {"steps": [[1]]}, "steps[0]="),
    "a metric without a value": (lambda s: s | {"steps": [RESULT | {"metrics": [{"metric": "x"}]}]},
                                 "steps[0].metrics[0].value is missing"),
    "a step twice": (lambda s: s | {"steps": [RESULT, RESULT]}, "one record per step"),
    "a start in the future": (lambda s: s | {"steps": [RESULT | {"started_at": 4e9}]}, "steps[0].started_at"),
    "negative seconds": (lambda s: s | {"steps": [RESULT | {"seconds": -1}]}, "steps[0].seconds"),
    "a bool for seconds": (lambda s: s | {"steps": [RESULT | {"seconds": True}]}, "steps[0].seconds"),
    "an unknown status": (lambda s: s | {"steps": [RESULT | {"status": "ok"}]}, "steps[0].status"),
    "suite a list": (lambda s: s | {"suite": []}, "suite="),
}


@pytest.mark.parametrize("case", REFUSED)
def test_collect_names_the_file_and_field_of_a_damaged_summary_in_one_line(case, tmp_path):
    damage, field = REFUSED[case]
    archive = _archive(tmp_path / "suite.tar.gz", damage(copy.deepcopy(SUMMARY)))
    line = _one_line_or_none(lambda: collect.main([str(archive), "--root", str(tmp_path / "repo")]))
    assert f"{archive}'s summary.json is invalid: " in line and field in line, line
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(("raw", "said"), [
    ({"steps/env/result.json": json.dumps(RESULT | {"step": "kernels"}).encode()},
     "steps/env/result.json is invalid: step='kernels': must be its folder's 'env'"),
    ({"claims.csv": b"claim,value\nx,1\n"}, "claims.csv is invalid: its header ['claim', 'value'] lacks"),
    ({"claims.csv": b"experiment,claim\nx,\xff\n"}, "claims.csv is invalid: not UTF-8 text"),
    ({"claims.csv": b"experiment,claim\nx,y,z\n"}, "claims.csv is invalid: line 2=['z']"),
])
def test_collect_refuses_a_kept_result_or_claims_table_that_is_not_the_suites(raw, said, tmp_path):
    archive = _archive(tmp_path / "suite.tar.gz", **{"steps/env/result.json": RESULT} | raw)
    line = _one_line_or_none(lambda: collect.main([str(archive), "--root", str(tmp_path / "repo")]))
    assert f"{archive}'s {said}" in line, line
    assert not (tmp_path / "repo").exists()


def test_a_newer_suites_unknown_keys_are_read_and_older_text_holds_are_bools(tmp_path):
    newer = RESULT | {"per_rank": {"0": 1}, "metrics": [METRIC | {"holds": "False", "spread_ms": 0.1}]}
    result = gpu_records.step_result(newer, "result.json")
    assert result.metrics[0].holds is False
    (tmp_path / "steps" / "env").mkdir(parents=True)
    (tmp_path / "steps" / "env" / "result.json").write_text(json.dumps(newer))
    assert state.read_result(tmp_path, "env").status == "done"  # was: a TypeError traceback
    assert gpu_records.lease(LEASE | {"sweeps": {"x": {"seeds": [0]}}}, "lease.json")["sweeps"]


def test_a_damaged_result_is_a_warning_and_the_step_is_due_again(tmp_path, capsys):
    (tmp_path / "steps" / "env").mkdir(parents=True)
    (tmp_path / "steps" / "env" / "result.json").write_text("[1, 2]")
    assert state.read_result(tmp_path, "env") is None
    assert [s.name for s in suite.pending(tmp_path, list(STEPS[:1]), set(), False)] == ["env"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}/steps/env/result.json is invalid: its content=" in err


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else b"/" for p in root.rglob("*")}


def test_collect_writes_a_lease_all_or_nothing(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    _keep(root / "docs" / "gpu", LEASE)
    collect.collect(_archive(tmp_path / "first.tar.gz", SUMMARY | {"steps": [RESULT | {"commit": "fff0000"}]}),
                    root)
    before = _snapshot(root)
    archive = _archive(tmp_path / "suite.tar.gz")
    opened = []
    real_open = os.open

    def full_disk_at(n):
        def fake(path, flags, *args):
            if flags & os.O_WRONLY and ".writing-" in str(path):
                opened.append(path)
                if len(opened) == n:
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real_open(path, flags, *args)
        return fake

    for n in range(1, 7):  # the step result, env.json, summary.json, lease.json, its provenance, leases.md
        opened.clear()
        monkeypatch.setattr(output_files.os, "open", full_disk_at(n))
        line = _one_line_or_none(lambda: collect.main([str(archive), "--root", str(root)]))
        assert "No space left on device" in line
        assert _snapshot(root) == before, n  # was: the lease written, leases.md not updated
    monkeypatch.setattr(output_files.os, "open", real_open)
    collect.collect(archive, root)
    assert "2026-09-21_abc1234" in (root / "docs" / "gpu" / "leases.md").read_text().split("h100 |")[-1]


def test_a_damaged_kept_lease_is_skipped_with_a_warning_by_next_and_publish(tmp_path, monkeypatch, capsys):
    gpu = tmp_path / "docs" / "gpu"
    _keep(gpu, LEASE)
    bad = _keep(gpu, LEASE | {"device": "h100"}, claim="from the damaged lease")
    (bad / "lease.json").write_text(json.dumps(["a", "list"]))
    results = tmp_path / "docs" / "RESULTS.md"
    results.write_text(f"# Results\n{gpu_claims.BEGIN}\n{gpu_claims.END}\n")
    gpu_claims.write(results, gpu)
    assert "| gain |" in results.read_text() and "damaged" not in results.read_text()
    monkeypatch.setattr(suite, "REPO_ROOT", tmp_path)
    assert suite.main(["--next", "--budget-min", "9", "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert "GPU queue at" in out and "Traceback" not in err
    assert err.splitlines() == [(f"warning: {bad}/lease.json is invalid: its content=['a', 'list']: must be a "
                                 "mapping (a lease's record); the lease is skipped")]


def test_next_reads_an_archive_with_the_size_limits_of_every_reader(tmp_path, monkeypatch, capsys):
    archive = _archive(tmp_path / "suite.tar.gz")
    assert [r.step for r in queue.suite_in_progress(archive)] == ["env"]
    monkeypatch.setattr(archive_members, "MAX_FILE_BYTES", 100)  # summary.json is larger
    assert queue.suite_in_progress(archive) == []  # was: read whole, whatever its size
    assert "more than the 0 MiB any file" in capsys.readouterr().err


HOSTILE = ["<!-- /gpu-claims -->", "<script>alert(1)</script>", "[click](javascript:alert(1))",
           "<javascript:alert(1)>", "![x](http://evil.example/x.png)", "see https://evil.example or www.evil.example",
           "a | b", "<img src=x onerror=alert(1)>"]


def test_a_lease_s_text_in_results_md_is_plain_text_that_cannot_end_its_section(tmp_path):
    gpu = tmp_path / "gpu"
    for i, text in enumerate(HOSTILE):
        lease = LEASE | {"lease": f"2026-09-{10 + i}_abc1234", "engine": text}
        _keep(gpu, lease, claim=text.replace('"', ""))
    results = tmp_path / "RESULTS.md"
    results.write_text(f"before\n{gpu_claims.BEGIN}\n{gpu_claims.END}\nafter\n")
    gpu_claims.write(results, gpu)
    first = results.read_text()
    gpu_claims.write(results, gpu)
    assert results.read_text() == first  # was: more of the claim's text left behind on every publish
    assert first.count(gpu_claims.END) == 1 and first.endswith(f"{gpu_claims.END}\nafter\n")
    section = first[first.index(gpu_claims.BEGIN) + len(gpu_claims.BEGIN):first.index(gpu_claims.END)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "H200" in line]
    assert len(rows) == len(HOSTILE) and all(row.count(" | ") == 10 for row in rows)  # no cell split by a '|'
    cells = "\n".join(rows).replace("](gpu/h200/", "")
    for active in ("<", "://", "www."):  # a tag or comment, an autolink
        assert active not in cells, active
    assert not re.search(r"(?<!\\)\]\(", cells)  # a link or image: its bracket escaped


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)
FIELDS = {"summary": [("suite",), ("steps",), ("steps", 0), ("suite", "dry_run"), ("suite", "budget_min"),
                      *(("steps", 0, key) for key in [*RESULT, "newer"]), ("steps", 0, "metrics", 0),
                      *(("steps", 0, "metrics", 0, key) for key in METRIC)],
          "result": [(), *((key,) for key in [*RESULT, "newer"]), ("metrics", 0, "value"), ("metrics", 0, "holds")],
          "lease": [(), *((key,) for key in [*LEASE, "sweeps"])]}


def _set(record, path: tuple, value):
    if not path:
        return value
    record = copy.deepcopy(record)
    inner = record
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return record


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(sorted(FIELDS)), data=st.data(), value=JSON)
def test_any_json_value_in_any_field_is_a_line_or_a_skipped_lease_never_a_traceback(tmp_path_factory, which,
                                                                                     data, value):
    tmp = tmp_path_factory.mktemp("records")
    path = data.draw(st.sampled_from(FIELDS[which]))
    summary = _set(SUMMARY, path, value) if which == "summary" else SUMMARY
    result = _set(RESULT, path, value) if which == "result" else RESULT
    lease = _set(LEASE, path, value) if which == "lease" else LEASE
    gpu = tmp / "repo" / "docs" / "gpu"
    _keep(gpu, LEASE | {"device": "h100"}, claim="kept")
    damaged = gpu / "h200" / "2026-09-21_abc1234"
    damaged.mkdir(parents=True)
    for name, record in (("lease.json", lease), ("summary.json", summary), ("steps/env/result.json", result)):
        (damaged / name).parent.mkdir(parents=True, exist_ok=True)
        (damaged / name).write_text(json.dumps(record))
    (damaged / "claims.csv").write_text(CLAIMS.format(claim="maybe"))
    with contextlib.redirect_stderr(io.StringIO()):
        assert "| kept |" in gpu_claims.section(gpu)  # publish --gpu-claims: the sound lease always shown
        assert any(r.device == "h100" for r in queue.kept_runs(gpu))  # --next: likewise
        archive = _archive(tmp / "suite.tar.gz", summary, result)
        _one_line_or_none(lambda: collect.main([str(archive), "--root", str(tmp / "repo")]))
        queue.suite_in_progress(archive)  # --next --restore
        state.restore(tmp / "out", archive)  # --restore, then what the suite reads of it
        suite.pending(tmp / "out", list(STEPS[:2]), set(), False)
        state.results(tmp / "out", ["env"])
