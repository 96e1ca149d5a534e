"""No command replaces kept results of another source, scale, machine, GPU lease or commit unasked:
each writer into docs/ and profiles/ refuses in one ``error:`` line naming what it would replace,
exit 2, before writing anything, unless ``--force``; GPU leases keep a folder each; readers of a
partial results root draw what they can and name what is missing. Every command runs as a user
starts it, on temporary roots, never on the repository's docs/."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import torch

from sarathi_lab import output_files, provenance
from sarathi_lab.config import EngineConfig
from sarathi_lab.provenance import Provenance

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), MPLBACKEND="Agg")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env=ENV, cwd=ROOT)


def _refused(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: would replace ")
    return line


# The sidecar and its check.

def test_a_file_is_known_by_its_nearest_sidecar_and_a_folder_entry_covers_everything_under_it(tmp_path):
    lease = Provenance("measured GPU", machine="NVIDIA H200", lease="2026-01-01_abc1234", commit="abc1234")
    provenance.record_folder(tmp_path / "lease", {provenance.EVERYTHING: lease})
    (tmp_path / "lease" / "steps" / "env").mkdir(parents=True)
    assert provenance.recorded(tmp_path / "lease" / "steps" / "env" / "env.json") == lease
    figure = Provenance("measured CPU", "full", "Test CPU", commit="abc1234")
    provenance.record({tmp_path / "figures" / "a.png": figure})
    assert provenance.recorded(tmp_path / "figures" / "a.png") == figure
    assert provenance.recorded(tmp_path / "figures" / "b.png") is None  # the sidecar does not name it
    assert provenance.recorded(tmp_path / "elsewhere.png") is None


def test_a_file_of_other_or_unknown_provenance_conflicts_and_nothing_else_does(tmp_path):
    full = Provenance("measured CPU", "full", "Test CPU", commit="abc1234", writer="a")
    for name in ("same.csv", "other.csv", "unknown.csv", "unrecorded.csv"):
        (tmp_path / name).write_text("x\n")
    provenance.record({tmp_path / "same.csv": full, tmp_path / "other.csv": full,
                       tmp_path / "unrecorded.csv": Provenance("measured CPU", commit=provenance.UNRECORDED)})
    ci = Provenance("measured CPU", "ci", "Test CPU", commit="abc1234")
    planned = {tmp_path / "same.csv": Provenance("measured CPU", "full", "Test CPU", commit="abc1234", writer="b"),
               tmp_path / "other.csv": ci, tmp_path / "unknown.csv": ci, tmp_path / "new.csv": ci,
               tmp_path / "unrecorded.csv": Provenance("measured CPU", commit=provenance.UNRECORDED)}
    # A run that recorded no commit cannot be told from another: its file is not replaced unasked.
    assert {c.path.name for c in provenance.conflicts(planned)} == {"other.csv", "unknown.csv", "unrecorded.csv"}
    with pytest.raises(provenance.ReplaceRefused, match=r"would replace 3 file\(s\).*full scale.*new: measured CPU, "
                                                        r"ci scale.*--force"):
        provenance.check(planned, False, "--force replaces them")
    provenance.check(planned, True, "")  # told


def test_commits_are_short_distinct_and_name_a_run_without_one():
    assert provenance.commits(["9e2ae41aaaaaaa", "9e2ae41", None, float("nan")]) == "9e2ae41+unrecorded"
    assert provenance.commits([]) == ""


# Every run records its commit, even where the code has no .git.

@pytest.mark.parametrize("name", ["SARATHI_COMMIT", "SARATHI_GPU_COMMIT"])
def test_a_copy_without_git_records_the_commit_it_was_told_and_where_from(monkeypatch, name):
    from sarathi_lab import code_commit
    from sarathi_lab.harness import environment

    monkeypatch.setattr(code_commit, "_run_git", lambda *args: None)  # the GPU suite's copy: no .git
    for each in code_commit.COMMIT_ENV:
        monkeypatch.delenv(each, raising=False)
    monkeypatch.setenv(name, "9e2ae41")
    env = environment.collect_environment(EngineConfig(), torch.device("cpu"), torch.float32, None, {})
    assert (env["git_commit"], env["git_commit_source"], env["git_dirty"]) == ("9e2ae41", name, None)
    monkeypatch.delenv(name)
    env = environment.collect_environment(EngineConfig(), torch.device("cpu"), torch.float32, None, {})
    assert env["git_commit"] is None and env["git_commit_source"] in (None, "pip")


def test_a_clone_records_git_s_commit_over_the_variable(monkeypatch):
    from sarathi_lab import code_commit

    monkeypatch.setattr(code_commit, "_git", lambda *args: "f" * 40 if args[0] == "rev-parse" else "")
    monkeypatch.setenv("SARATHI_COMMIT", "0000000")
    assert code_commit.source_commit() == ("f" * 40, "git")


def test_the_engine_a_set_of_runs_ran_is_read_from_their_records():
    from sarathi_lab.harness.environment import engine_kind

    assert engine_kind([{"cuda_graphs": [1, 2]}, {"cuda_graphs": [1]}]) == "decode CUDA graphs"
    assert engine_kind([{"cuda_graphs": None}, {}]) == "eager"  # {}: a run from before the key
    mixed = {"decode_sizes": [1, 2], "mixed_tokens": [16, 32]}
    assert engine_kind([{"cuda_graphs": mixed}]) == "decode and mixed CUDA graphs"
    assert engine_kind([{"cuda_graphs": mixed | {"mixed_tokens": []}}]) == "decode CUDA graphs"
    assert engine_kind([{"cuda_graphs": None}, {"cuda_graphs": [4]}]) == "decode CUDA graphs and eager (runs differ)"
    assert engine_kind([]) is None


# GPU leases: a folder each, an index, profiles read from the newest or a named one.

def _archive(tmp_path: Path, commit: str = "abc1234", started: float = 1795744987.0, graphs=(1, 2)) -> Path:
    out = tmp_path / f"out_{commit}"
    files = {"steps/env/env.json": json.dumps({"device": "NVIDIA H200"}),
             "summary.json": json.dumps({"suite": {"dry_run": False, "commit": commit}, "steps": [
                 {"step": "env", "status": "done", "started_at": started, "commit": commit},
                 {"step": "paper.pd_ratio", "status": "incomplete", "started_at": started + 60, "commit": commit}]}),
             "summary.csv": "step,metric\n", "figures/overhead.png": "png", "profiles/h200/llama-13b.csv": "op\n",
             "paper/pd_ratio/multiruns/gpu/0_x/metrics.json": json.dumps(
                 {"environment": {"cuda_graphs": list(graphs) or None}}),
             "steps/engine/llama/config.json": "{}"}
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    archive = tmp_path / f"suite_{commit}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in files:
            tar.add(out / name, arcname=name)
    return archive


def test_collect_keeps_each_lease_in_its_own_folder_with_an_index(tmp_path):
    repo = tmp_path / "repo"
    first = _run("sarathi_lab.measure", "gpu_collect", str(_archive(tmp_path, "abc1234", graphs=())),
              "--root", str(repo))
    assert first.returncode == 0, first.stderr
    second = _run("sarathi_lab.measure", "gpu_collect", str(_archive(tmp_path, "def5678", 1795825800.0)),
                  "--root", str(repo))
    assert second.returncode == 0, second.stderr
    old, new = repo / "docs/gpu/h200/2026-11-27_abc1234", repo / "docs/gpu/h200/2026-11-28_def5678"
    assert {p.relative_to(old).as_posix() for p in old.rglob("*") if p.is_file()} == {
        "steps/env/env.json", "summary.json", "summary.csv", "figures/overhead.png", "lease.json", "provenance.json"}
    assert (new / "summary.json").is_file() and not (repo / "docs/gpu/h200/summary.json").exists()
    assert (repo / "profiles/h200/2026-11-27_abc1234/llama-13b.csv").is_file()
    assert (repo / "profiles/h200/2026-11-28_def5678/llama-13b.csv").is_file()
    index = (repo / "docs/gpu/leases.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| h200 ")]
    assert len(rows) == 2 and "| `abc1234` | eager |" in rows[0] and "| `def5678` | decode CUDA graphs |" in rows[1]
    assert "not done: paper.pd_ratio (incomplete)" in rows[0]
    # The same lease again (a later call's archive of it): its own files, replaced without asking.
    again = _run("sarathi_lab.measure", "gpu_collect", str(_archive(tmp_path, "abc1234", graphs=())),
              "--root", str(repo))
    assert again.returncode == 0, again.stderr


def test_collect_refuses_to_replace_another_lease_s_files_unless_forced(tmp_path):
    repo = tmp_path / "repo"
    lease = repo / "docs/gpu/h200/2026-11-27_abc1234"
    (lease / "figures").mkdir(parents=True)
    (lease / "figures" / "overhead.png").write_text("another lease's")
    provenance.record_folder(lease, {provenance.EVERYTHING: Provenance("measured GPU", lease="2026-11-27_0000000")})
    archive = _archive(tmp_path)
    line = _refused(_run("sarathi_lab.measure", "gpu_collect", str(archive), "--root", str(repo)))
    assert "docs/gpu/h200/2026-11-27_abc1234/figures/overhead.png (measured GPU, lease 2026-11-27_0000000" in line
    assert "--force" in line and (lease / "figures" / "overhead.png").read_text() == "another lease's"
    assert not (lease / "summary.json").exists()
    assert _run("sarathi_lab.measure", "gpu_collect", str(archive), "--root", str(repo), "--force").returncode == 0
    assert (lease / "figures" / "overhead.png").read_text() == "png"


def test_collect_refuses_an_archive_whose_lease_is_unknown(tmp_path):
    out = tmp_path / "out"
    (out / "steps/env").mkdir(parents=True)
    (out / "steps/env/env.json").write_text(json.dumps({"device": "NVIDIA H200"}))
    archive = tmp_path / "suite.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out / "steps/env/env.json", arcname="steps/env/env.json")
    run = _run("sarathi_lab.measure", "gpu_collect", str(archive), "--root", str(tmp_path / "repo"))
    assert run.returncode == 2 and run.stderr.strip() == (
        f"error: {archive} is invalid: it has no readable summary.json, so its lease (the date and commit its "
        "steps ran at) is unknown")
    assert not (tmp_path / "repo").exists()


def test_profiles_are_read_from_the_newest_lease_the_one_measured_here_or_a_named_one(tmp_path, monkeypatch):
    from sarathi_lab.sim.profiles import LEASE_ENV, own_profile_path, profile_path, profiled_devices

    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path))
    monkeypatch.delenv(LEASE_ENV, raising=False)
    for lease in ("2026-11-26_6218397", "2026-11-27_9e2ae41"):
        (tmp_path / "h200" / lease).mkdir(parents=True)
        (tmp_path / "h200" / lease / "llama-13b.csv").write_text("op\n")
    (tmp_path / "h200" / "2026-11-26_6218397" / "mistral-7b.csv").write_text("op\n")
    assert profile_path("h200", "llama-13b") == tmp_path / "h200/2026-11-27_9e2ae41/llama-13b.csv"
    # The newest lease that has one: the later lease did not profile Mistral-7B.
    assert profile_path("h200", "mistral-7b") == tmp_path / "h200/2026-11-26_6218397/mistral-7b.csv"
    assert profiled_devices() == [("h200", "llama-13b"), ("h200", "mistral-7b")]
    monkeypatch.setenv(LEASE_ENV, "2026-11-26_6218397")
    assert profile_path("h200", "llama-13b") == tmp_path / "h200/2026-11-26_6218397/llama-13b.csv"
    monkeypatch.delenv(LEASE_ENV)
    # task=profile's own table, measured here, is read before any lease's, and is where it writes.
    own_profile_path("h200", "llama-13b").write_text("op\n")
    assert profile_path("h200", "llama-13b") == own_profile_path("h200", "llama-13b") == tmp_path / "h200/llama-13b.csv"


def test_the_committed_leases_are_indexed_and_each_profile_lease_is_readable():
    from sarathi_lab.measure.gpu.collect import leases

    found = {(lease["device"], lease["lease"]): lease for lease in leases(ROOT)}
    kept = {("h200", "2026-11-26_6218397"), ("h100", "2026-11-26_27958ff"), ("h200", "2026-11-27_9e2ae41")}
    assert kept <= set(found)
    assert found["h200", "2026-11-26_6218397"]["engine"] == "eager"
    index = (ROOT / "docs/gpu/leases.md").read_text()
    for (device, lease), record in found.items():
        assert f"[{lease}]({device}/{lease}/" in index
        for model in record["profiles"]:
            assert (ROOT / "profiles" / device / lease / f"{model}.csv").is_file()


# publish and claims_table: refusals and partial roots.

SIMULATED = {"executor": "sim", "sim_device": "a6000", "sim_cost_model": "calibrated", "sim_tp": 1}


def _pd_ratio_root(root: Path, scale: str = "ci", simulated: bool = False) -> Path:
    sweep = root / "pd_ratio/multiruns/2026-01-01"
    for job, (scheduler, throughput) in enumerate((("static", 100.0), ("sarathi", 120.0))):
        run = sweep / str(job)
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({
            "config": {"scheduler": scheduler, "model": "cpu-small", "seed": 0, "scale": scale, "chunk": 64,
                       "seq_len": 256, "batch_size": 4, "pd_ratio": 8.0},
            "overrides": [], "resolved_config": {"engine": SIMULATED if simulated else {"executor": "model"}},
            "summary": {"total_throughput_tok_s": throughput},
            "environment": {"device": "cpu", "device_name": "Test CPU", "dtype": "float32", "torch_threads": 2,
                            "timing_unreliable": False, "git_commit": "abc1234" + "0" * 33}}))
    return root


def _docs(tmp_path: Path) -> Path:
    """A copy of the committed claims table, capacity tables and figures' provenance."""
    docs = tmp_path / "docs"
    for name in ("figures/claims.csv", "figures/provenance.json", "figures/pd_ratio.png", "capacity"):
        source, dest = ROOT / "docs" / name, docs / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, dest)
    return docs


def test_publish_refuses_to_replace_full_scale_results_with_ci_ones_and_writes_nothing(tmp_path):
    root, docs = _pd_ratio_root(tmp_path / "runs"), _docs(tmp_path)
    before = {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()}
    line = _refused(_run("sarathi_lab.measure", "publish", "--measured", str(root), "--docs", str(docs)))
    assert "would replace 2 file(s)" in line
    assert f"{docs}/figures/pd_ratio.png (measured CPU, full scale" in line and "new: measured CPU, ci scale" in line
    assert f"{docs}/figures/claims.csv (" in line and "--force replaces them" in line
    assert {p: p.read_bytes() for p in docs.rglob("*") if p.is_file()} == before
    # Told: written, and recorded as what it now is; a second publish of the same runs is not refused.
    run = _run("sarathi_lab.measure", "publish", "--measured", str(root), "--docs", str(docs), "--force")
    assert run.returncode == 0, run.stderr[-3000:]
    assert provenance.recorded(docs / "figures" / "pd_ratio.png").scale == "ci"
    again = _run("sarathi_lab.measure", "publish", "--measured", str(root), "--docs", str(docs))
    assert again.returncode == 0, again.stderr[-3000:]
    # A measured root replaces the measured rows alone: the simulated ones stay as they were.
    before, after = (pd.read_csv(p, keep_default_na=False) for p in (ROOT / "docs/figures/claims.csv",
                                                                      docs / "figures/claims.csv"))
    simulated = [_rows(t[(t.machine == PREDICTED) & (t.experiment != "capacity")]) for t in (before, after)]
    assert simulated[0] and simulated[1] == simulated[0]


PREDICTED = "none: predicted by the cost model"


def _rows(table: pd.DataFrame) -> list[dict]:
    """Rows as the claims table writes them, every column of today's."""
    from sarathi_lab.analysis.claims import COLUMNS

    return table.reindex(columns=COLUMNS, fill_value="").astype(str).to_dict("records")


def test_publish_of_a_simulated_root_alone_replaces_its_experiments_simulated_rows_and_keeps_the_rest(tmp_path):
    root, docs = _pd_ratio_root(tmp_path / "sim", scale="full", simulated=True), _docs(tmp_path)
    committed = pd.read_csv(docs / "figures" / "claims.csv", keep_default_na=False)
    run = _run("sarathi_lab.measure", "publish", "--sim", str(root), "--docs", str(docs), "--force")
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_csv(docs / "figures" / "claims.csv", keep_default_na=False)
    # pd_ratio's simulated rows are the root's, at its commit; every cost model's committed ones are gone.
    ours = table[(table.experiment == "pd_ratio") & (table.machine == PREDICTED)]
    assert set(ours.source) == {"simulated A6000 (calibrated), cpu-small"} and set(ours.commit) == {"abc1234"}
    assert len(ours) == 2
    # Every other row as it was: the measured ones (pd_ratio's too), the other experiments' simulated ones.
    others = [committed[(committed.experiment != "capacity") & ((committed.experiment != "pd_ratio")
                                                                | (committed.machine != PREDICTED))],
              table[(table.experiment != "capacity") & ~table.index.isin(ours.index)]]
    assert _rows(others[1]) == _rows(others[0])
    assert "simulated rows kept as committed (no --sim root has them): per_token_cost" in run.stdout
    assert provenance.recorded(docs / "figures" / "claims.csv").commit == "abc1234"


def test_publish_draws_what_a_partial_root_has_and_names_what_it_lacks(tmp_path):
    root, docs = _pd_ratio_root(tmp_path / "runs"), tmp_path / "new_docs"
    shutil.copytree(ROOT / "docs" / "capacity", docs / "capacity")
    run = _run("sarathi_lab.measure", "publish", "--measured", str(root), "--docs", str(docs))
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"per_token_cost: no finished run under {root}" in run.stdout
    assert (docs / "figures" / "pd_ratio.png").is_file() and not (docs / "figures" / "per_token_cost.png").exists()
    table = pd.read_csv(docs / "figures" / "claims.csv", keep_default_na=False)
    lacking = table[table.experiment == "per_token_cost"]
    assert len(lacking) == 1 and lacking.ours.iloc[0] == f"no finished run under {root}"
    assert lacking.holds.iloc[0] == "n/a" and (table.experiment == "pd_ratio").sum() == 2


def test_publish_into_a_fresh_folder_draws_the_runs_and_names_the_capacity_tables_it_lacks(tmp_path):
    root, docs = _pd_ratio_root(tmp_path / "runs"), tmp_path / "fresh"
    run = _run("sarathi_lab.measure", "publish", "--measured", str(root), "--docs", str(docs))
    assert run.returncode == 0, run.stderr[-3000:]
    assert (docs / "figures" / "pd_ratio.png").is_file() and (docs / "figures" / "claims.csv").is_file()
    assert f"capacity: no sim_capacity.csv, sim_tradeoff.csv under {docs / 'capacity'}" in run.stdout


def test_claims_table_of_a_root_without_pd_ratio_names_it(tmp_path):
    from sarathi_lab.analysis import claims
    from sarathi_lab.analysis.runs import Results

    _pd_ratio_root(tmp_path / "runs")
    shutil.move(tmp_path / "runs" / "pd_ratio", tmp_path / "runs" / "elsewhere")
    sim = _pd_ratio_root(tmp_path / "sim")
    rows = claims.claims_table(Results(tmp_path / "runs"), [Results(sim)], only=("pd_ratio",)).to_dict("records")
    assert rows[0]["ours"] == f"no finished run under {tmp_path / 'runs'}" and rows[0]["holds"] == "n/a"
    assert len(rows) == 3  # the simulated root's two rows still judged


# sim_vs_gpu, sim_fidelity, sim_validate, pipeline, tile_alignment: refusals.

def _serving_root(root: Path, graphs) -> Path:
    run = root / "orca_compare/multiruns/gpu/0_x"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({
        "config": {"task": "serve"}, "summary": {}, "overrides": [], "resolved_config": {}, "partial": False,
        "environment": {"executor": "model", "device_name": "NVIDIA H200", "cuda_graphs": graphs,
                        "git_commit": None}}))
    for name, task in (("tile_quantization", "iteration_sweep"), ("capacity", "capacity")):
        other = root / f"{name}/multiruns/gpu/0_y"
        other.mkdir(parents=True)
        (other / "metrics.json").write_text(json.dumps({
            "config": {"task": task}, "summary": {}, "overrides": [], "resolved_config": {},
            "partial": False, "environment": {"executor": "model"}}))
    return root


def test_sim_vs_gpu_refuses_to_replace_the_committed_comparison_of_other_runs(tmp_path):
    from sarathi_lab.measure.sim_check import sim_vs_gpu

    committed = ROOT / "docs/sim/vs_gpu/h200_2026-11-27_9e2ae41"
    runs, out = _serving_root(tmp_path / "runs", None), tmp_path / "sim"
    shutil.copytree(committed, out)
    line = _refused(_run("sarathi_lab.measure", "sim_vs_gpu", "--runs", str(runs), "--out", str(out),
                         "--lease", "2026-11-27_9e2ae41"))
    assert "would replace 4 file(s)" in line
    assert "(decode CUDA graphs), NVIDIA H200, lease 2026-11-27_9e2ae41, commit 9e2ae41;" in line
    assert "new: simulated h200 (roofline+profile+calibrated) against measured runs (eager)" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in committed.iterdir()}
    # The older comparison (sections 9, 9b) is none of the files it writes.
    assert not set(sim_vs_gpu.OUTPUTS) & {p.name for p in (ROOT / "docs/sim").glob("validation_h*")}
    # What it compares and what it leaves out, said; the engine the runs ran, from their records.
    compared, left_out = sim_vs_gpu.finished_runs(runs)
    assert len(compared) == 2 and dict(left_out) == {"capacity (task=capacity, no comparison)": 1}
    serving = "orca_compare/multiruns/gpu/0_x"
    assert sim_vs_gpu.measured_engine([_serving_root(tmp_path / "graphs", [1, 2]) / serving]) == "decode CUDA graphs"
    assert sim_vs_gpu.measured_engine([runs / serving]) == "eager"


@pytest.mark.parametrize("command, existing", [
    (["sarathi_lab.measure", "sim_fidelity", "--smoke"], "fidelity_errors.csv"),
    (["sarathi_lab.measure", "sim_validate", "--smoke"], "validation.csv"),
    (["sarathi_lab.measure", "sim_pipeline", "--smoke"], "pipeline_summary.csv"),
])
def test_docs_sim_writers_refuse_a_file_another_run_wrote(tmp_path, command, existing):
    (tmp_path / existing).write_text("another run's\n")  # no provenance.json names it: unknown
    line = _refused(_run(*command, "--out", str(tmp_path)))
    assert f"{tmp_path / existing} (unknown provenance" in line and "--force" in line
    assert (tmp_path / existing).read_text() == "another run's\n"


def test_tile_alignment_refuses_a_table_another_command_wrote(tmp_path):
    out = tmp_path / "tile_alignment.csv"
    out.write_text("x\n")
    _refused(_run("sarathi_lab.measure", "tile_alignment", "--out", str(out)))
    assert out.read_text() == "x\n"


def test_the_committed_docs_sim_tables_are_what_their_writers_would_write_now():
    # Rerunning tile_alignment into docs/sim replaces its own tables unasked: same provenance; the
    # pipeline's name the commit that simulated them (the claims row built on them says it).
    docs = ROOT / "docs" / "sim"
    recorded = provenance.recorded(docs / "pipeline_summary.csv")
    assert (recorded.source, recorded.scale) == ("simulated A100 (pipeline)", "10000 requests")
    assert re.fullmatch(r"[0-9a-f]{7}", recorded.commit)
    assert provenance.recorded(docs / "tile_alignment.csv").scale == ""


def test_capacity_docs_refuses_to_replace_the_cpu_capacity_table_unless_forced(tmp_path):
    from tests.test_capacity_docs import _searches

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "capacity", docs / "capacity")
    runs = _searches(tmp_path / "runs")
    committed = (docs / "capacity" / "cpu_capacity.csv").read_bytes()
    line = _refused(_run("sarathi_lab.measure", "capacity_docs", str(runs), "--docs", str(docs)))
    # The committed table's own provenance is named, whatever machine it was measured on.
    assert f"{docs}/capacity/cpu_capacity.csv (" in line and "new: measured CPU, full scale, Test CPU" in line
    assert (docs / "capacity" / "cpu_capacity.csv").read_bytes() == committed
    done = _run("sarathi_lab.measure", "capacity_docs", str(runs), "--docs", str(docs), "--force")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (docs / "capacity" / "cpu_capacity.csv").read_bytes() != committed


# publish writes its whole set at once, or none of it.

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _results_md(docs: Path) -> None:
    shutil.copy(ROOT / "docs" / "RESULTS.md", docs / "RESULTS.md")
    (docs / "sim").mkdir(exist_ok=True)
    for name in ("pipeline_summary.csv", "provenance.json"):
        shutil.copy(ROOT / "docs" / "sim" / name, docs / "sim" / name)


def test_a_publish_failing_midway_leaves_every_file_of_its_set_as_it_was(tmp_path, monkeypatch):
    from sarathi_lab.analysis import figures, publish

    root, docs = _pd_ratio_root(tmp_path / "runs"), _docs(tmp_path)
    _results_md(docs)
    before = _snapshot(docs)
    drawn, png = [], figures.png

    def fails_at_the_second(fig):
        drawn.append(fig)
        if len(drawn) == 2:  # pd_ratio.png drawn, the capacity figure next
            raise RuntimeError("the figure could not be drawn")
        return png(fig)

    monkeypatch.setattr(figures, "png", fails_at_the_second)
    with pytest.raises(RuntimeError, match="could not be drawn"):
        publish.main(["--measured", str(root), "--docs", str(docs), "--force"])
    assert len(drawn) == 2 and _snapshot(docs) == before  # no figure, no table, no page, no provenance
    monkeypatch.setattr(figures, "png", png)
    publish.main(["--measured", str(root), "--docs", str(docs), "--force"])
    after = _snapshot(docs)
    assert {"figures/pd_ratio.png", "figures/claims.csv", "figures/provenance.json", "RESULTS.md"} <= {
        name for name in after if after[name] != before.get(name)}
    assert not [name for name in after if ".writing-" in name]


def _as_read_only(monkeypatch):
    """Every folder as a read-only filesystem answers the writer's probe (a temporary file)."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(output_files.tempfile, "TemporaryFile", read_only)


def test_a_read_only_docs_folder_is_refused_in_one_line_before_any_figure_is_drawn(tmp_path, monkeypatch, capsys):
    from sarathi_lab.analysis import publish, registry

    root, docs = _pd_ratio_root(tmp_path / "runs"), _docs(tmp_path)
    before, drawn = _snapshot(docs), []
    monkeypatch.setattr(registry, "draw", lambda *args: drawn.append(args))
    _as_read_only(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        publish.main(["--measured", str(root), "--docs", str(docs), "--force"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and not drawn and _snapshot(docs) == before
    assert line == (f"error: --docs={docs} is invalid: {docs} cannot be written (Read-only file "
                    "system); nothing was written")


@pytest.fixture
def read_only_docs(tmp_path):
    """A copy of the docs publish reads, on a read-only filesystem (root ignores a chmod)."""
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True,
                             check=False)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        docs = _docs(where)
        _results_md(docs)
        (docs / "gpu").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        yield docs
    finally:
        subprocess.run(["umount", str(where)], check=False)


@pytest.mark.parametrize("what", [["--measured", "{root}", "--force"], ["--gpu-claims"]])
def test_publish_into_a_read_only_filesystem_is_refused_in_one_line(read_only_docs, tmp_path, what):
    docs, root = read_only_docs, _pd_ratio_root(tmp_path / "runs")
    before = _snapshot(docs)
    run = _run("sarathi_lab.measure", "publish", *(a.format(root=root) for a in what), "--docs", str(docs))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"error: --docs={docs} is invalid: ") and "(Read-only file system); nothing was " \
        "written" in line, line
    assert _snapshot(docs) == before


# capacity_docs writes its table, figures and claims rows at once, or none of them.

def test_a_capacity_docs_failing_midway_leaves_every_file_as_it_was(tmp_path, monkeypatch):
    from sarathi_lab.analysis import capacity_docs, figures
    from tests.test_capacity_docs import _searches

    runs, docs = _searches(tmp_path / "runs"), _docs(tmp_path)
    before, staged_tables = _snapshot(docs), []
    drawn, png, refresh = [], figures.png, capacity_docs.refresh

    def fails_at_the_second(fig):
        drawn.append(fig)
        if len(drawn) == 2:  # capacity.png drawn, the trade-off next
            raise RuntimeError("the figure could not be drawn")
        return png(fig)

    def refresh_seeing_the_table(stage, shown=None):
        staged_tables.append((stage / "capacity" / capacity_docs.CPU_CSV).read_bytes())
        return refresh(stage, shown)

    monkeypatch.setattr(figures, "png", fails_at_the_second)
    monkeypatch.setattr(capacity_docs, "refresh", refresh_seeing_the_table)
    with pytest.raises(RuntimeError, match="could not be drawn"):
        capacity_docs.main([str(runs), "--docs", str(docs), "--force"])
    # The new CPU table was written (into the staged copy) before the figure failed; none of it came out.
    assert len(drawn) == 2 and staged_tables[0] != before["capacity/cpu_capacity.csv"]
    assert _snapshot(docs) == before
    monkeypatch.setattr(figures, "png", png)
    done = _run("sarathi_lab.measure", "capacity_docs", str(runs), "--docs", str(docs), "--force")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(docs / name) for name in (
        "capacity/cpu_capacity.csv", "figures/capacity.png", "figures/capacity_tradeoff.png", "figures/claims.csv")]
    after = _snapshot(docs)
    assert after["capacity/cpu_capacity.csv"] == staged_tables[0]
    assert {name for name in after if after[name] != before.get(name)} == {
        "capacity/cpu_capacity.csv", "capacity/provenance.json", "figures/capacity.png",
        "figures/capacity_tradeoff.png", "figures/claims.csv"}
    assert not [name for name in after if ".writing-" in name]
    # Again from the same searches (told: no commit recorded, so not known to be the same runs): the same bytes.
    again = _run("sarathi_lab.measure", "capacity_docs", str(runs), "--docs", str(docs), "--force")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _snapshot(docs) == after


@pytest.mark.parametrize("searched", [True, False])
def test_a_read_only_docs_folder_is_refused_by_capacity_docs_before_any_figure_is_drawn(tmp_path, monkeypatch,
                                                                                       capsys, searched):
    from sarathi_lab.analysis import capacity_docs
    from tests.test_capacity_docs import _searches

    runs, docs = _searches(tmp_path / "runs"), _docs(tmp_path)
    before, drawn = _snapshot(docs), []
    monkeypatch.setattr(capacity_docs, "draw", lambda *args: drawn.append(args))
    _as_read_only(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        capacity_docs.main([*([str(runs)] if searched else []), "--docs", str(docs), "--force"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and not drawn and _snapshot(docs) == before
    where = docs / "capacity" if searched else docs
    assert line == (f"error: --docs={docs} is invalid: {where} cannot be written (Read-only file "
                    "system); nothing was written")


@pytest.mark.parametrize("given", ["a_file", "a_file/docs"])
def test_capacity_docs_into_a_file_or_under_one_is_refused_in_one_line(tmp_path, given):
    (tmp_path / "a_file").write_text("x\n")
    run = _run("sarathi_lab.measure", "capacity_docs", "--docs", str(tmp_path / given))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = run.stderr.strip().splitlines()
    problem = "is a file, not a folder" if given == "a_file" else "is a file, and it would be written under it"
    assert line == f"error: --docs={tmp_path / given} is invalid: {tmp_path / 'a_file'} {problem}; nothing was written"
    assert (tmp_path / "a_file").read_text() == "x\n"


def test_capacity_docs_into_a_read_only_filesystem_is_refused_in_one_line(read_only_docs, tmp_path):
    from tests.test_capacity_docs import _searches

    docs, runs = read_only_docs, _searches(tmp_path / "runs")
    before = _snapshot(docs)
    run = _run("sarathi_lab.measure", "capacity_docs", str(runs), "--docs", str(docs), "--force")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"error: --docs={docs} is invalid: ") and "(Read-only file system); nothing was " \
        "written" in line, line
    assert _snapshot(docs) == before
