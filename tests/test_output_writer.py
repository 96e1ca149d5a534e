"""Every measurement command writes through one writer (sarathi_lab/output_files.py): only into the
folder it was given, links resolved, never into a collected lease's folder; never over a file of
another provenance without --force; a folder, a path under a file, a read-only or full disk refused
in one `error:` line before the command's work; a failure while writing leaves no partial table;
two commands of one call never share a file. Each case starts a command's entry point."""
from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from pathlib import Path

import pytest

from sarathi_lab import output_files
from sarathi_lab.analysis import attribute
from sarathi_lab.measure import __main__ as measure
from sarathi_lab.measure.bench import case
from sarathi_lab.measure.sim_check import sim_pipeline
from tests.test_attribution import synthetic_lease

ROOT = Path(__file__).resolve().parents[1]
CEILINGS = ["ceilings", "--dry"]


def _run(main, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv) or 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _refused(main, argv: list[str]) -> str:
    code, out, err = _run(main, argv)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "# machine:" not in out  # refused before the measurement's work
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_attribute_never_writes_through_a_link_beside_the_lease(tmp_path):
    folder = synthetic_lease(tmp_path / "gpu" / "h100" / "2026-11-01_abc1234")
    outside = tmp_path / "precious.csv"
    outside.write_text("kept\n")
    (folder.parent / f"{folder.name}.attribution.csv").symlink_to(outside)
    for force in ([], ["--force"]):
        line = _refused(attribute.main, [str(folder), *force])
        assert "attribution.csv is a link: a writer replaces only a plain file" in line
    assert outside.read_text() == "kept\n" and not (folder.parent / f"{folder.name}.attribution.md").exists()


def test_a_lease_named_dot_is_attributed_beside_its_folder_which_stays_as_collected(tmp_path, monkeypatch):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")
    (folder / "provenance.json").write_text('{"*": {"source": "measured GPU"}}\n')
    before = _files(folder)
    monkeypatch.chdir(folder)
    code, _out, err = _run(attribute.main, ["."])
    assert code == 0, err
    assert _files(folder) == before  # no hidden .attribution.* inside, its provenance.json as it was
    assert {p.name for p in folder.parent.glob("*.attribution.*")} == {
        "2026-11-01_abc1234.attribution.csv", "2026-11-01_abc1234.attribution.md"}


def test_no_writer_writes_into_a_collected_lease_s_folder(tmp_path):
    folder = synthetic_lease(tmp_path / "h100" / "2026-11-01_abc1234")
    line = _refused(measure.main, [*CEILINGS, "--out", str(folder / "steps" / "env" / "ceilings.csv")])
    assert f"{folder} is a collected lease's folder (it holds lease.json)" in line
    assert not (folder / "steps" / "env" / "ceilings.csv").exists()


def test_a_committed_docs_table_is_replaced_only_with_force(tmp_path):
    docs = tmp_path / "docs" / "sim"
    docs.mkdir(parents=True)
    for name in ("tile_alignment.csv", "provenance.json"):
        shutil.copy(ROOT / "docs" / "sim" / name, docs / name)
    before = _files(docs)
    line = _refused(measure.main, [*CEILINGS, "--out", str(docs / "tile_alignment.csv")])
    assert "would replace 1 file(s)" in line and "new: measured CPU: ceilings, smoke scale" in line
    assert _files(docs) == before
    code, _, err = _run(measure.main, [*CEILINGS, "--out", str(docs / "tile_alignment.csv"), "--force"])
    assert code == 0, err
    assert (docs / "tile_alignment.csv").read_bytes() != before["tile_alignment.csv"]


def test_two_benchmarks_of_one_call_never_share_a_file(tmp_path, monkeypatch):
    # `all --out t.csv` gave every benchmark t.csv, each replacing the one before.
    monkeypatch.setattr(case, "ALL", ("ceilings", "ceilings"))
    code, out, err = _run(measure.main, ["all", "--dry", "--out", str(tmp_path / "t.csv")])
    assert code == 2 and err.splitlines() == [
        (f"error: --out={tmp_path / 't.ceilings.csv'} is invalid: {tmp_path / 't.ceilings.csv'} was written "
        "by an earlier command of this call: each command needs its own file; nothing was written")], err
    assert out.count("# machine:") == 1  # the second refused before its work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["provenance.json", "t.ceilings.csv"]


@pytest.mark.parametrize("where, says", [
    ("dir.csv", "is not a plain file (a folder, a FIFO or other)"),
    ("a_file/t.csv", "a_file is a file, not a folder"),
    ("a_file/below/t.csv", "a_file is a file, and it would be written under it"),
])
def test_an_out_path_that_cannot_be_a_table_is_refused_before_the_work(tmp_path, where, says):
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "a_file").write_text("x\n")
    line = _refused(measure.main, [*CEILINGS, "--out", str(tmp_path / where)])
    assert line.startswith(f"error: --out={tmp_path / where} is invalid: ") and says in line


def test_a_read_only_disk_is_refused_before_the_work(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(output_files.tempfile, "TemporaryFile", read_only)
    line = _refused(sim_pipeline.main, ["--smoke", "--out", str(tmp_path / "out")])
    assert f"{tmp_path} cannot be written (Read-only file system); nothing was written" in line


def test_a_full_disk_is_refused_before_the_work(tmp_path, monkeypatch):
    full = os.statvfs(tmp_path)
    monkeypatch.setattr(output_files.os, "statvfs", lambda path: type(full)((*full[:4], 10, *full[5:])))
    line = _refused(sim_pipeline.main, ["--smoke", "--out", str(tmp_path / "out")])
    assert "disk has" in line and "less than the 1 MiB its tables need" in line
    assert not (tmp_path / "out").exists()


def test_a_disk_filling_up_while_writing_leaves_no_partial_table(tmp_path, monkeypatch):
    real_open, opened = os.open, []

    def full_at_the_second(path, flags, *args):
        if flags & os.O_WRONLY and ".writing-" in str(path):
            opened.append(path)
            if len(opened) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args)

    monkeypatch.setattr(output_files.os, "open", full_at_the_second)
    out = tmp_path / "out"
    code, _, err = _run(sim_pipeline.main, ["--smoke", "--requests", "40", "--out", str(out)])
    assert code == 2 and err.splitlines() == [
        (f"error: --out={out}: cannot write {out / 'pipeline_summary.csv'} (No space left on device); "
        "nothing was written")], err
    assert not out.exists() or not list(out.iterdir())
