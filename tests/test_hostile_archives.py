"""Hostile GPU archives, built here: every path an archive's content names (members, commit, device,
lease, step names) stays inside its root or the archive is refused in one ``error:`` line (exit 2)
before anything is written; only regular files and folders are read, within size bounds; a damaged
archive is one line, never a traceback or a hang. Both readers: the suite's ``--restore``
(measure/gpu/state.restore) and ``gpu.collect``."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarathi_lab.measure.gpu import archive_members, collect, state, suite

ENV = {"device": "NVIDIA H100 80GB HBM3"}
STEP = {"step": "env", "status": "done", "started_at": 1_790_000_000.0, "commit": "abc1234"}


def _summary(**step) -> dict:
    return {"suite": {"dry_run": False}, "steps": [STEP | step]}


def _files(env=ENV, summary=None) -> dict[str, bytes]:
    return {"steps/env/env.json": json.dumps(env).encode(), "summary.json": json.dumps(summary or _summary()).encode(),
            "claims.csv": b"experiment,claim,ours\npd_ratio,gain,1x\n",
            "profiles/llama-13b/attention.csv": b"tokens,s\n1,0.1\n"}


def _tar(path: Path, files: dict[str, bytes], extra=(), mode: str = "w:gz") -> Path:
    """``files`` as regular members, then ``extra``: TarInfos (links, FIFOs, folders) with their bytes."""
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name: str, kind: bytes, link: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


def _written(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def _refused_in_one_line(capsys, call) -> str:
    with pytest.raises(SystemExit) as exit_:
        call()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_a_well_formed_archive_is_collected_and_restored(tmp_path):
    archive = _tar(tmp_path / "suite.tar.gz", _files())
    written = collect.collect(archive, tmp_path / "repo")
    assert any("docs/gpu/h100/" in p.as_posix() for p in written)
    assert state.restore(tmp_path / "out", archive) == 4


# Each: what a hostile archive holds, and a word its refusal must say.
FIELDS = {
    "commit climbing out": ({"summary": _summary(commit="x/../../../../../../ESCAPED")}, "commit"),
    "commit a number": ({"summary": _summary(commit=12345)}, "commit"),
    "commit unknown": ({"summary": _summary(commit="?")}, "commit"),
    "commit dot-dot": ({"summary": _summary(commit="..")}, "commit"),
    "step name a path": ({"summary": _summary(step="../../x")}, "step"),
    "start time not a time": ({"summary": _summary(started_at="soon")}, "started_at"),
    "start time overflowing": ({"summary": _summary(started_at="1" + "0" * 400)}, "started_at"),
    "steps not a list": ({"summary": {"suite": {}, "steps": {"a": 1}}}, "steps"),
    "device missing": ({"env": {"gpu": "H100"}}, "device"),
    "device a number": ({"env": {"device": 100}}, "device"),
    "device climbing out": ({"env": {"device": "../.."}}, "device"),
    "device empty": ({"env": {"device": " "}}, "device"),
    "env a list": ({"env": ["NVIDIA H100"]}, "env.json"),
}


@pytest.mark.parametrize("case", FIELDS)
def test_collect_refuses_json_fields_that_name_no_safe_folder_before_writing(case, tmp_path, capsys):
    fields, word = FIELDS[case]
    archive = _tar(tmp_path / "suite.tar.gz", _files(**fields))
    repo = tmp_path / "repo"
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(repo)]))
    assert word in line and str(archive) in line
    assert _written(repo) == [] and _written(tmp_path.parent / "ESCAPED") == []


def _env_json_a(kind: str) -> tuple[dict, list]:
    files = _files()
    del files["steps/env/env.json"]
    if kind == "folder":
        return files, [(_info("steps/env/env.json", tarfile.DIRTYPE), None)]
    return files, [(_info("steps/env/env.json", tarfile.SYMTYPE, "../../summary.json"), None)]


@pytest.mark.parametrize("kind", ["folder", "symlink"])
def test_collect_refuses_an_env_record_that_is_not_a_file_naming_it(kind, tmp_path, capsys):
    files, extra = _env_json_a(kind)
    archive = _tar(tmp_path / "suite.tar.gz", files, extra)
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(tmp_path / "repo")]))
    assert "env.json" in line
    assert _written(tmp_path / "repo") == []


# Each: (regular files, other members) of an archive no reader may take, and a word its refusal says.
def _members(tmp: Path) -> dict[str, tuple[dict, list, str]]:
    good = _files()
    return {
        "member climbing out": (good | {"steps/../../x.json": b"{}"}, [], "safe name"),
        "absolute member": (good | {"/tmp/x.json": b"{}"}, [], "safe name"),
        "dot member": (good | {"steps/./x.json": b"{}"}, [], "safe name"),
        "300-character name": (good | {"steps/" + "a" * 300 + ".json": b"{}"}, [], "safe name"),
        "odd characters": (good | {"steps/x\ny.json": b"{}"}, [], "safe name"),
        "too deep": (good | {"/".join(["d"] * 40) + ".json": b"{}"}, [], "deep"),
        "symlink": (good, [(_info("steps/x.json", tarfile.SYMTYPE, "/etc/passwd"), None)], "symbolic link"),
        "hard link": (good, [(_info("steps/x.json", tarfile.LNKTYPE, "summary.json"), None)], "hard link"),
        "fifo": (good, [(_info("steps/fifo.json", tarfile.FIFOTYPE), None)], "FIFO"),
        "device": (good, [(_info("steps/dev.json", tarfile.CHRTYPE), None)], "device"),
        "file and parent": (good | {"steps/env": b"x"}, [], "both a file and the folder"),
        "twice": (good, [(_info("claims.csv", tarfile.REGTYPE, size=2), b"ab")], "twice"),
    }


@pytest.mark.parametrize("case", list(_members(Path("."))))
def test_both_readers_refuse_hostile_members_in_one_line_before_writing(case, tmp_path, capsys):
    files, extra, word = _members(tmp_path)[case]
    archive = _tar(tmp_path / "suite.tar.gz", files, extra)
    repo, out = tmp_path / "repo", tmp_path / "out"
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(repo)]))
    assert word in line, line
    with pytest.raises(ValueError, match=word) as refused:
        state.restore(out, archive)
    assert "\n" not in str(refused.value)
    assert _written(repo) == [] and _written(out) == []


def test_members_and_archives_over_their_size_bounds_are_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(archive_members, "MAX_FILE_BYTES", 1000)
    big = _tar(tmp_path / "big.tar.gz", _files() | {"steps/env/big.log": b"0" * 1001})
    with pytest.raises(ValueError, match="more than the 0 MiB any file"):
        state.restore(tmp_path / "out", big)
    monkeypatch.setattr(archive_members, "MAX_FILE_BYTES", 1 << 20)
    monkeypatch.setattr(archive_members, "MAX_TOTAL_BYTES", 5000)
    many = _tar(tmp_path / "many.tar.gz", _files() | {f"steps/env/{i}.log": b"0" * 999 for i in range(6)})
    with pytest.raises(ValueError, match="expand to more than"):
        collect.collect(many, tmp_path / "repo")
    monkeypatch.setattr(archive_members, "MAX_ARCHIVE_BYTES", 100)
    with pytest.raises(ValueError, match="more than the 0 MiB a suite's archive"):
        state.restore(tmp_path / "out", _tar(tmp_path / "ok.tar.gz", _files()))
    assert _written(tmp_path / "out") == [] and _written(tmp_path / "repo") == []


def _damaged(tmp: Path, how: str) -> Path:
    whole = _tar(tmp / "whole.tar.gz", _files() | {"steps/env/noise.log": os.urandom(100_000)}).read_bytes()
    path = tmp / "suite.tar.gz"
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    else:
        path.write_bytes({"truncated": whole[: len(whole) // 2], "truncated at the end": whole[:-9],
                          "corrupt": whole[:200] + bytes(b ^ 0xFF for b in whole[200:400]) + whole[400:],
                          "empty": b"", "not gzip": b"PK\x03\x04 a zip"}[how])
    return path


@pytest.mark.parametrize("how", ["truncated", "truncated at the end", "corrupt", "empty", "not gzip", "fifo",
                                 "folder"])
def test_a_damaged_or_unreadable_archive_is_one_line_and_never_waits(how, tmp_path, capsys):
    archive = _damaged(tmp_path, how)
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(tmp_path / "repo")]))
    assert "not a readable tar archive" in line
    with pytest.raises(ValueError, match="not a readable tar archive"):
        state.restore(tmp_path / "out", archive)
    assert _written(tmp_path / "repo") == [] and _written(tmp_path / "out") == []


def test_restore_never_writes_through_a_link_already_in_out(tmp_path):
    outside, out = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    (out / "steps").mkdir(parents=True)
    (out / "steps" / "env").symlink_to(outside)  # a folder link pointing away
    archive = _tar(tmp_path / "suite.tar.gz", _files())
    with pytest.raises(ValueError, match="outside"):
        state.restore(out, archive)
    assert _written(outside) == []
    (out / "steps" / "env").unlink()
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (out / ".claims.csv.restoring").symlink_to(victim)  # a partial-file name pointing away
    assert state.restore(out, archive) == 4
    assert victim.read_text() == "kept" and (out / "claims.csv").read_bytes() == _files()["claims.csv"]


def test_restore_into_an_out_that_cannot_take_a_file_is_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "profiles").write_text("a file where the archive has a folder")
    with pytest.raises(ValueError, match=r"^--out=.* is invalid: profiles/llama-13b/attention.csv cannot be written"):
        state.restore(out, _tar(tmp_path / "suite.tar.gz", _files()))
    assert not list(out.rglob(".*.restoring"))


def test_collect_writes_through_no_link_and_refuses_a_sidecar_that_is_a_folder(tmp_path, capsys):
    archive, repo = _tar(tmp_path / "suite.tar.gz", _files()), tmp_path / "repo"
    lease = repo / "docs" / "gpu" / "h100" / "2026-09-21_abc1234"
    (lease / "provenance.json").mkdir(parents=True)
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(repo), "--force"]))
    assert "provenance.json" in line
    assert _written(repo) == ["docs", "docs/gpu", "docs/gpu/h100", "docs/gpu/h100/2026-09-21_abc1234",
                              "docs/gpu/h100/2026-09-21_abc1234/provenance.json"]
    (lease / "provenance.json").rmdir()
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (lease / "claims.csv").symlink_to(victim)
    line = _refused_in_one_line(capsys, lambda: collect.main([str(archive), "--root", str(repo), "--force"]))
    assert "'claims.csv'" in line and "outside" in line and victim.read_text() == "kept"


def test_the_suite_refuses_an_out_or_export_folder_it_cannot_use_in_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = tmp_path / "out"
    cases = {"$OUT a file": ([], str(blocker), "$OUT="), "$OUT is --out": ([], str(out), "apart from --out"),
             "--out under a file": (["--out", str(blocker / "out")], None, "--out="),
             "--restore is --out": (["--restore", str(out)], None, "--restore="),
             "--out is the archive": (["--out", str(blocker), "--restore", str(blocker)], None, "--out=")}
    for case, (args, export, word) in cases.items():
        monkeypatch.delenv("OUT", raising=False)
        if export is not None:
            monkeypatch.setenv("OUT", export)
        argv = ["--dry-run", "--steps", "env", "--out", str(out), *args]
        line = _refused_in_one_line(capsys, lambda argv=argv: suite.main(argv))
        assert word in line, (case, line)
    assert blocker.read_text() == "x"


NAME = st.text(st.sampled_from("ab./-_=\\:~ \n\x00é*?"), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.lists(NAME, min_size=1, max_size=4).map("/".join), min_size=1, max_size=4))
def test_any_member_names_are_restored_inside_out_or_refused_before_writing(tmp_path_factory, names):
    tmp = tmp_path_factory.mktemp("prop")
    out = tmp / "box" / "out"
    try:
        archive = _tar(tmp / "a.tar", {n: b"x" for n in names}, mode="w")
    except (ValueError, UnicodeError):
        return  # tarfile itself will not write the name
    try:
        state.restore(out, archive)
    except ValueError as e:
        assert "\n" not in str(e)
        assert _written(out) == []
    box = _written(tmp / "box")
    assert all(p == "out" or p.startswith("out/") for p in box), box
    assert all((tmp / "box" / p).resolve().is_relative_to(out.resolve()) for p in box if p != "out")


def test_the_suites_own_archive_leaves_links_out_and_its_export_writes_through_none(tmp_path):
    out, dest, victim = tmp_path / "out", tmp_path / "OUT", tmp_path / "victim"
    victim.write_text("kept")
    job = out / "paper" / "pd_ratio" / "multiruns" / "2026-01-01_00-00-00" / "0_chunk=256,seq_len=1024"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("chunk: 256\n")
    (out / "summary.json").write_text("{}")
    (out / "steps").mkdir()
    (out / "steps" / "link.json").symlink_to(victim)
    dest.mkdir()
    (dest / "summary.json").symlink_to(victim)
    state.export(out, dest)
    assert victim.read_text() == "kept" and (dest / "summary.json").read_text() == "{}"
    fresh = tmp_path / "fresh"
    assert state.restore(fresh, dest / state.ARCHIVE) == 2  # the link was never archived
    assert (fresh / job.relative_to(out) / ".hydra" / "config.yaml").read_text() == "chunk: 256\n"


def test_the_suites_own_archive_leaves_out_a_file_its_reader_would_refuse(tmp_path, monkeypatch):
    monkeypatch.setattr(archive_members, "MAX_FILE_BYTES", 1000)
    out = tmp_path / "out"
    (out / "steps" / "env").mkdir(parents=True)
    (out / "steps" / "env" / "result.json").write_text("{}")
    (out / "steps" / "env" / "big.csv").write_bytes(b"0" * 1001)
    notes = state.archive(out, tmp_path / state.ARCHIVE)
    assert any("big.csv" in note and "left out" in note for note in notes)
    assert state.restore(tmp_path / "fresh", tmp_path / state.ARCHIVE) == 1
