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
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab import output_files
from sarathi_lab.analysis import attribute
from sarathi_lab.measure import __main__ as measure
from sarathi_lab.measure.bench import case
from sarathi_lab.measure.gpu import predict
from sarathi_lab.measure.sim_check import calibration_cli, convert_gpu_kernels, sim_pipeline
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


def _vidur(tmp_path: Path) -> list[str]:
    """A git repository holding one model's vidur profile (TP 1 and 2), and an attention table."""
    from tests.test_sim_gpu_kernels import _vidur_rows

    repo = tmp_path / "vidur"
    mlp = repo / "data" / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    mlp.parent.mkdir(parents=True)
    pd.concat([_vidur_rows([1, 64]), _vidur_rows([64], tp=2)]).to_csv(mlp, index=False)
    for git in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit",
                                               "-qm", "profiles"]):
        subprocess.run(["git", "-C", str(repo), *git], check=True, capture_output=True)
    attention = tmp_path / "attention.csv"
    pd.DataFrame({"kind": ["prefill", "decode"], "batch_size": [1, 8], "prefill_chunk_size": [512, 0],
                  "kv_cache_size": [1024, 1024], "median_ms": [0.2, 0.1]}).to_csv(attention, index=False)
    return ["--vidur", str(repo), "--attention", str(attention)]


def test_converted_kernel_tables_are_written_at_once_below_the_folder_given(tmp_path):
    out, vidur = tmp_path / "kernels", _vidur(tmp_path)
    code, _, err = _run(convert_gpu_kernels.main, [*vidur, "--out", str(out)])
    assert code == 0, err
    assert sorted(_files(out)) == ["a100/llama2-7b.csv", "a100/tp2/llama2-7b.csv", "models.csv",
                                   "provenance.json"]
    assert "measured GPU: vidur's kernel profiles" in (out / "provenance.json").read_text()
    code, _, err = _run(convert_gpu_kernels.main, [*vidur, "--out", str(out)])
    assert code == 0, err  # the same vidur commit again: its own tables, replaced unasked


def test_a_converted_table_of_another_provenance_or_through_a_link_is_refused(tmp_path):
    out, elsewhere = tmp_path / "kernels", tmp_path / "elsewhere"
    (out / "a100").mkdir(parents=True)
    (out / "a100" / "llama2-7b.csv").write_text("kept\n")
    line = _refused(convert_gpu_kernels.main, [*_vidur(tmp_path), "--out", str(out)])
    assert "a100/llama2-7b.csv (unknown provenance" in line and line.endswith(
        "--force replaces them; --out DIR writes elsewhere")
    elsewhere.mkdir()
    (out / "a100" / "tp2").symlink_to(elsewhere)
    line = _refused(convert_gpu_kernels.main, [*_vidur(tmp_path / "b"), "--out", str(out), "--force"])
    assert f"{out / 'a100' / 'tp2'} is reached through a link, out of {out}" in line
    assert (out / "a100" / "llama2-7b.csv").read_text() == "kept\n" and not list(elsewhere.iterdir())


def test_a_converter_given_no_vidur_profiles_is_refused_in_one_line(tmp_path):
    args = _vidur(tmp_path)
    args[1] = str(tmp_path)  # no git repository
    line = _refused(convert_gpu_kernels.main, [*args, "--out", str(tmp_path / "out")])
    assert line.startswith(f"error: --vidur={tmp_path} is invalid: its HEAD holds no ")
    assert not (tmp_path / "out").exists()


def test_the_calibration_writes_device_files_where_asked_and_keeps_another_s(tmp_path, monkeypatch):
    out = tmp_path / "devices"
    out.mkdir()
    (out / "a100.yaml").write_text("kept\n")
    line = _refused(calibration_cli.main, ["--out", str(out)])
    assert "a100.yaml (unknown provenance" in line and (out / "a100.yaml").read_text() == "kept\n"
    code, _, err = _run(calibration_cli.main, ["--out", str(out), "--force"])
    assert code == 0, err
    for name in ("a100.yaml", "h100.yaml"):  # the committed device files, as committed
        assert (out / name).read_bytes() == (calibration_cli.DEVICES_DIR / name).read_bytes()
    code, _, err = _run(calibration_cli.main, ["--out", str(out)])
    assert code == 0, err  # its own files, of the same leases: replaced unasked
    monkeypatch.setattr(calibration_cli, "calibrations", lambda: pytest.fail("fitted"))
    (tmp_path / "a_file").write_text("x\n")
    line = _refused(calibration_cli.main, ["--out", str(tmp_path / "a_file" / "devices")])
    assert "a_file is a file, and it would be written under it" in line


def _predicted(steps, devices, cost_models, work):
    return pd.DataFrame([{"step": "paper.capacity", "device": d, "cost_model": c, "job": 0,
                          "serving_s": 1.0} for d in devices for c in cost_models])


def test_predictions_are_refused_before_the_simulation_over_a_table_of_another_run(tmp_path, monkeypatch):
    monkeypatch.setattr(predict, "predict", lambda *a: pytest.fail("simulated"))
    at = predict.engine_code.short_commit() or "unknown"
    (tmp_path / f"predictions_h200_{at}.csv").write_text("kept\n")
    line = _refused(predict.main, ["--devices", "h100,h200", "--out", str(tmp_path)])
    assert f"predictions_h200_{at}.csv (unknown provenance" in line
    (tmp_path / "a_file").write_text("x\n")
    line = _refused(predict.main, ["--out", str(tmp_path / "a_file")])
    assert "a_file is a file, not a folder" in line
    monkeypatch.setattr(predict, "predict", _predicted)
    code, out, err = _run(predict.main, ["--devices", "h100,h200", "--out", str(tmp_path), "--force"])
    assert code == 0, err
    assert f"wrote {tmp_path / f'predictions_h100_{at}.csv'}" in out
    assert "simulated H200 (profile, calibrated)" in (tmp_path / "provenance.json").read_text()


def test_the_versus_vllm_figure_and_claims_are_written_together_or_refused_before_drawing(tmp_path, monkeypatch):
    from sarathi_lab.analysis import versus_vllm
    from tests.test_versus_vllm import TBT, _runs

    monkeypatch.setattr(versus_vllm, "load_runs", lambda root: _runs(TBT))
    docs = tmp_path / "docs"
    code, _, err = _run(versus_vllm.main, [str(tmp_path), "--docs", str(docs)])
    assert code == 0, err
    assert sorted(_files(docs / "figures")) == ["provenance.json", "versus_vllm.png",
                                                "versus_vllm_claims.csv"]
    (docs / "figures" / "versus_vllm_claims.csv").write_text("kept\n")
    (docs / "figures" / "provenance.json").unlink()
    monkeypatch.setattr(versus_vllm, "figure", lambda runs: pytest.fail("drawn"))
    line = _refused(versus_vllm.main, [str(tmp_path), "--docs", str(docs)])
    assert "would replace 2 file(s)" in line and "--docs DIR writes into another folder" in line
    assert (docs / "figures" / "versus_vllm_claims.csv").read_text() == "kept\n"


def test_the_chunk_alignment_table_is_refused_before_its_sweeps_where_it_cannot_be_written(tmp_path, monkeypatch):
    from sarathi_lab.measure.sim_check import sensitivity, sim_chunk_align

    monkeypatch.setattr(sensitivity, "run_sweeps", lambda sweeps, root: pytest.fail("swept"))
    (tmp_path / "dir.csv").mkdir()
    line = _refused(sim_chunk_align.main, ["--out", str(tmp_path / "dir.csv")])
    assert line.startswith(f"error: --out={tmp_path / 'dir.csv'} is invalid: ") and "not a plain file" in line


def test_the_cpu_capacity_table_is_written_through_the_writer_or_refused_in_one_line(tmp_path):
    from sarathi_lab.analysis import capacity_docs
    from tests.test_capacity_docs import _searches

    runs, docs = _searches(tmp_path / "runs"), tmp_path / "docs"
    (docs / "capacity").mkdir(parents=True)
    (docs / "capacity" / capacity_docs.CPU_CSV).write_text("kept\n")
    line = _refused(capacity_docs.main, [str(runs), "--docs", str(docs)])
    assert f"{capacity_docs.CPU_CSV} (unknown provenance" in line and "--force replaces it" in line
    (tmp_path / "a_file").write_text("x\n")
    line = _refused(capacity_docs.main, [str(runs), "--docs", str(tmp_path / "a_file")])
    assert "a_file is a file, and it would be written under it" in line
    assert capacity_docs.tabulate(runs, docs, force=True) == docs / "capacity" / capacity_docs.CPU_CSV
    assert "measured CPU" in (docs / "capacity" / "provenance.json").read_text()
