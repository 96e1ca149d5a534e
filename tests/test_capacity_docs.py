"""analysis/capacity_docs.py: the CPU table from a folder of searches, the figures and the capacity
rows of the committed claims table, on a copy of docs/."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from sarathi_lab.analysis import capacity_docs
from sarathi_lab.analysis.capacity import MEASURED_COLUMNS, SIMULATED_COLUMNS, TABLE_COLUMNS, compact, load_searches
from sarathi_lab.analysis.claims import COLUMNS
from sarathi_lab.harness import REPO_ROOT

CAPACITIES = {("sarathi_serve", 0.45): 0.6, ("vllm", 0.45): 0.3, ("sarathi_serve", 2.25): 0.8, ("vllm", 2.25): 0.5}


def _searches(root, executor="model", experiment="capacity", commit=None):
    """One finished search per (scheduler, SLO), as task=capacity leaves it."""
    for i, ((scheduler, slo), qps) in enumerate(CAPACITIES.items()):
        run = root / str(i)
        run.mkdir(parents=True)
        (run / "capacity.json").write_text(json.dumps({
            "capacity_rps": qps, "resolution": 0.2, "binding": "tbt_p99_s", "bounded": True,
            "trials": [{"rate_rps": qps, "passed": True}, {"rate_rps": qps * 1.2, "passed": False}],
            "slo": {"tbt_p99_s": slo, "sched_delay_p50_s": 2.0}}))
        (run / "metrics.json").write_text(json.dumps({
            "config": {"scheduler": scheduler, "executor": executor, "model": "cpu-small", "scale": "full",
                       "dtype": "bfloat16", "experiment": experiment},
            "summary": {"capacity_rps": qps, "token_budget": 256 if scheduler == "sarathi_serve" else None},
            "overrides": [], "resolved_config": {},
            "environment": {"device_name": "Test CPU", "torch_threads": 2, "timing_unreliable": False,
                            "git_commit": commit}
            | ({"sim_device": "h100", "sim_cost_model": "calibrated", "sim_tp": 1} if executor == "sim" else {})}))
    return root


def docs_copy(root, cpu_table: bool = False):
    """A copy of the committed simulated tables and claims table, with a CPU table from made-up
    searches or none, so that what draws into docs/ leaves the repository's alone."""
    docs = root / "docs"
    (docs / "capacity").mkdir(parents=True)
    (docs / "figures").mkdir()
    for name in (f"capacity/{capacity_docs.SIM_CSV}", f"capacity/{capacity_docs.TRADEOFF_CSV}",
                 f"capacity/{capacity_docs.TP_CSV}", f"capacity/{capacity_docs.TRACE_CSV}",
                 "figures/claims.csv"):
        shutil.copy(REPO_ROOT / "docs" / name, docs / name)
    if cpu_table:
        capacity_docs.tabulate(_searches(root / "runs"), docs)
    return docs


@pytest.fixture
def docs(tmp_path):
    return docs_copy(tmp_path)


def test_the_cpu_table_has_the_simulated_columns_and_what_it_ran_on(tmp_path, docs):
    path = capacity_docs.tabulate(_searches(tmp_path / "runs"), docs)
    table = pd.read_csv(path)
    assert list(table.columns) == TABLE_COLUMNS + MEASURED_COLUMNS
    assert list(zip(table.scheduler, table.tbt_slo_s)) == sorted(CAPACITIES, key=lambda k: (k[1], k[0]))
    assert set(table.device_name) == {"Test CPU"} and set(table.executor) == {"model"}


def test_the_cpu_tables_provenance_names_the_commit_its_searches_ran_at(tmp_path, docs):
    runs = _searches(tmp_path / "runs")
    for metrics in runs.rglob("metrics.json"):
        record = json.loads(metrics.read_text())
        record["environment"]["git_commit"] = "abcdef0123456789"
        metrics.write_text(json.dumps(record))
    capacity_docs.tabulate(runs, docs)
    sidecar = json.loads((docs / "capacity" / "provenance.json").read_text())
    assert sidecar[capacity_docs.CPU_CSV]["commit"] == "abcdef0"  # was "unrecorded" whatever the runs said


def test_tabulating_simulated_searches_as_the_cpu_table_is_refused(tmp_path, docs):
    with pytest.raises(SystemExit, match="expected capacity searches of executor=model"):
        capacity_docs.tabulate(_searches(tmp_path / "runs", executor="sim"), docs)
    assert not (docs / "capacity" / capacity_docs.CPU_CSV).exists()


def test_a_simulated_table_says_what_predicted_it_and_its_claims_name_that(tmp_path, docs):
    table = compact(load_searches(_searches(tmp_path / "runs", executor="sim")))
    assert list(table.columns) == TABLE_COLUMNS + SIMULATED_COLUMNS
    assert set(zip(table.sim_device, table.sim_cost_model, table.sim_tp)) == {("h100", "calibrated", 1)}
    # The committed table re-predicted on another device: its claims and figure say so, from the table alone.
    path = docs / "capacity" / capacity_docs.SIM_CSV
    pd.read_csv(path).assign(sim_device="h100", sim_cost_model="calibrated").to_csv(path, index=False)
    sources = set(capacity_docs.claims(docs).source)
    assert "simulated H100 (calibrated), mistral-7b (committed docs/capacity/sim_capacity.csv)" in sources
    # Only the trade-off's row, which reads its own table (still the A100's), names the A100.
    assert {s for s in sources if s.startswith("simulated A100 (roofline), mistral-7b")} == {
        f"simulated A100 (roofline), mistral-7b (committed docs/capacity/{capacity_docs.TRADEOFF_CSV})"}
    # One table, one cost model: a table that mixes two is refused, naming both.
    pd.read_csv(path).assign(sim_cost_model=lambda t: ["roofline"] + ["calibrated"] * (len(t) - 1)).to_csv(path)
    with pytest.raises(ValueError, match=r"sim_cost_model column holds 2 values \(roofline, calibrated\); a simulated "
                                         r"capacity table is one device's, cost model's and GPU count's"):
        capacity_docs.claims(docs)


def test_refresh_replaces_only_the_capacity_rows_of_the_claims_table(tmp_path, docs):
    claims = docs / "figures" / "claims.csv"
    before = pd.read_csv(claims, keep_default_na=False)
    others = before[before.experiment != "capacity"].reset_index(drop=True)
    capacity_docs.refresh(docs)
    unmeasured = pd.read_csv(claims, keep_default_na=False)
    # Every other row as it was, in the claims table's columns (one written before a column gains it).
    assert list(unmeasured.columns[:len(COLUMNS)]) == COLUMNS
    pd.testing.assert_frame_equal(unmeasured[:len(others)][list(others.columns)], others)
    rows = unmeasured[unmeasured.experiment == "capacity"]
    measured = rows[rows.source.str.startswith("measured")]
    assert len(rows) == 8 and set(measured.ours) >= {"not measured yet"} and set(measured.holds) == {"n/a"}
    # Against the paper both ways: the roofline's chunk overhead holds by construction, not judged; the
    # arxiv_summarization gain is judged against the paper's 2.6x on openchat_sharegpt4.
    assert rows[~rows.source.str.startswith("measured")].holds.tolist() == ["yes", "smaller", "n/a", "yes",
                                                                           "larger"]
    assert rows.iloc[5]["ours / paper"].startswith("by construction: the roofline cost model")
    # The Yi-34B searches on two A100s: simulated only, their strict-SLO ratio computed from the table.
    yi = pd.read_csv(docs / "capacity" / capacity_docs.TP_CSV)
    yi_strict = yi[yi.tbt_slo_s == yi.tbt_slo_s.min()].set_index("scheduler").capacity_rps
    tp_row, trace_row = rows.iloc[-2], rows.iloc[-1]
    # The arxiv_summarization searches: the calibrated cost model and the trace named in the source.
    arxiv = pd.read_csv(docs / "capacity" / capacity_docs.TRACE_CSV)
    strict = arxiv[arxiv.tbt_slo_s == 0.1].set_index("scheduler").capacity_rps
    assert trace_row.source.startswith("simulated A100 (calibrated), mistral-7b, arxiv_summarization lengths")
    assert trace_row.ours.startswith(f"{strict.sarathi_serve / strict.vllm:.2f}x at P99 TBT <= 0.1 s")
    assert tp_row.source == "simulated 2 x A100 (roofline, tensor parallel), yi-34b (committed docs/capacity/" \
                            "sim_capacity_yi34b.csv)"
    assert tp_row.ours.startswith(f"{yi_strict.sarathi_serve / yi_strict.vllm:.2f}x at P99 TBT <= 0.2 s")
    assert {p.name for p in (docs / "figures").glob("*.png")} == {"capacity.png", "capacity_tradeoff.png"}

    capacity_docs.tabulate(_searches(tmp_path / "runs"), docs)
    capacity_docs.refresh(docs)
    capacity_docs.refresh(docs)  # idempotent: the rows are replaced, not appended again
    measured = pd.read_csv(claims, keep_default_na=False)
    gain = measured[measured.experiment == "capacity"].iloc[0]
    # 2x against the paper's 2.6x, but with brackets reaching below half its effect: unclear.
    assert len(measured) == len(unmeasured) and gain.holds == "unclear" and "2.00x at P99 TBT <= 0.45 s" in gain.ours
    assert (gain.machine, gain["dtype"], gain.threads) == ("Test CPU", "bfloat16", "2")


def test_the_command_tabulates_a_multirun_and_redraws(tmp_path, docs):
    runs = _searches(tmp_path / "runs")
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "capacity_docs", str(runs), "--docs",
                           str(docs)], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (docs / "capacity" / "cpu_capacity.csv").exists() and (docs / "figures" / "capacity.png").exists()
    assert "cpu_capacity.csv" in done.stdout


def test_a_simulated_table_is_written_from_its_experiments_sweep_with_its_provenance(tmp_path, docs):
    sweep = _searches(tmp_path / "yi", executor="sim", experiment="capacity_sim_yi34b", commit="0123456789abcdef")
    before = (docs / "capacity" / capacity_docs.TP_CSV).read_text()
    # The committed table has no provenance entry: replaced only when asked.
    with pytest.raises(capacity_docs.output_files.OutputRefused, match="--force replaces it"):
        capacity_docs.write(None, docs, sims=(sweep,))
    assert (docs / "capacity" / capacity_docs.TP_CSV).read_text() == before
    written = capacity_docs.write(None, docs, force=True, sims=(sweep,))
    table = pd.read_csv(docs / "capacity" / capacity_docs.TP_CSV, dtype={"git_commit": str})
    assert docs / "capacity" / capacity_docs.TP_CSV in written and len(table) == len(CAPACITIES)
    assert set(table.sim_device) == {"h100"} and set(table.git_commit) == {"0123456789abcdef"}
    made = json.loads((docs / "capacity" / "provenance.json").read_text())[capacity_docs.TP_CSV]
    assert (made["source"], made["commit"]) == ("simulated H100 (calibrated), cpu-small", "0123456")
    assert made["writer"] == "python -m sarathi_lab.measure capacity_docs --sim"
    # The claims rows read the new table: its commit, as the table records it.
    claims = pd.read_csv(docs / "figures" / "claims.csv", keep_default_na=False, dtype=str)
    assert "0123456" in set(claims[claims.source.str.contains(capacity_docs.TP_CSV)].commit)


@pytest.mark.parametrize("experiment, executor, why", [
    ("capacity_sim", "sim", "allowed: one sweep of capacity_sim_yi34b, capacity_sim_arxiv"),  # publish --sim's
    ("capacity_sim_yi34b", "model", "expected capacity searches of executor=sim"),
])
def test_a_sweep_of_another_experiment_is_refused_in_one_line_before_anything_is_written(tmp_path, docs, experiment,
                                                                                          executor, why):
    sweep = _searches(tmp_path / "other", executor=executor, experiment=experiment)
    listing = sorted(p.name for p in (docs / "capacity").iterdir())
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.measure", "capacity_docs", "--sim", str(sweep),
                           "--docs", str(docs), "--force"], check=False, capture_output=True, text=True, cwd=tmp_path)
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and line.startswith(f"error: --sim={sweep} is invalid: ") and why in line, done.stderr
    assert sorted(p.name for p in (docs / "capacity").iterdir()) == listing
