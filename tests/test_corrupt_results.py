"""Readers of results name a damaged file and go on without it (or stop in one line when strict):
truncated, empty or corrupt metrics.json, one without resolved_config, a corrupt parquet table, a
corrupt sweep_summary.json. Damaged by hand, as a full disk, a kill or an editor leaves them."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab.analysis.runs import Results
from sarathi_lab.config import ConfigError
from sarathi_lab.harness.results import (
    METRICS,
    SWEEP_SUMMARY,
    RunResult,
    UnreadableRun,
    load_runs,
    write_results,
)
from sarathi_lab.harness.runner import _keep_finished_run


def _write_run(run_dir: Path, chunk: int) -> None:
    run_dir.mkdir(parents=True)
    table = pd.DataFrame({"iteration": [0, 1], "tokens": [chunk, 1]})
    write_results(run_dir, {"iterations": table}, RunResult(
        summary={"total_throughput_tok_s": float(chunk)}, config={"chunk": chunk, "scheduler": "sarathi"},
        environment={"device": "cpu", "dtype": "float32"}, overrides=[f"chunk={chunk}"],
        resolved_config={"chunk": chunk, "engine": {"executor": "sim"}}, partial=False, wall_time_s=1.0))


DAMAGE = {
    "truncated": lambda p: p.write_text(p.read_text()[:40]),
    "empty": lambda p: p.write_text(""),
    "not json": lambda p: p.write_bytes(b"\x00\xff garbage"),
    "no resolved_config": lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items()
                                                             if k != "resolved_config"})),
}


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "pd_ratio" / "multiruns" / "s1"
    for job, chunk in enumerate((32, 64, 128)):
        _write_run(root / str(job), chunk)
    return root


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_load_runs_names_a_damaged_metrics_file_and_goes_on(sweep, damage, caplog):
    bad = sweep / "1" / METRICS
    DAMAGE[damage](bad)
    with caplog.at_level(logging.WARNING):
        runs = load_runs(sweep)
    assert sorted(runs["chunk"]) == [32, 128]
    assert [r.getMessage() for r in caplog.records if str(bad) in r.getMessage()], caplog.text
    with pytest.raises(UnreadableRun, match=rf"^{bad} is unreadable \("):
        load_runs(sweep, strict=True)


def test_a_corrupt_table_is_named_and_left_out(sweep, caplog):
    bad = sweep / "2" / "iterations.parquet"
    bad.write_bytes(bad.read_bytes()[:50])
    with caplog.at_level(logging.WARNING):
        rows = load_runs(sweep, table="iterations")
    assert sorted(set(rows["chunk"])) == [32, 64] and str(bad) in caplog.text


def test_results_read_past_a_corrupt_sweep_summary_and_a_damaged_first_run(sweep, caplog):
    (sweep / SWEEP_SUMMARY).write_text('{"0": "ok", "1"')
    DAMAGE["empty"](sweep / "0" / METRICS)
    results = Results(sweep.parents[2])
    with caplog.at_level(logging.WARNING):
        # The jobs it lists unknown, those its folders hold stand, all finished: complete.
        state = results.choice("pd_ratio").state
        assert state.jobs == state.finished == ("0", "1", "2")
        assert results.executor("pd_ratio")["executor"] == "sim"  # from the first run it could read
        assert sorted(results.summary("pd_ratio")["chunk"]) == [64, 128]
    assert str(sweep / SWEEP_SUMMARY) in caplog.text and str(sweep / "0" / METRICS) in caplog.text


def test_on_existing_skip_over_a_damaged_run_is_refused_in_one_line(sweep):
    class Cfg:
        on_existing = "skip"
    DAMAGE["truncated"](sweep / "0" / METRICS)
    with pytest.raises(ConfigError, match=rf"^on_existing=skip: {sweep / '0' / METRICS} is unreadable .*"
                                          "on_existing=overwrite replaces it$"):
        _keep_finished_run(Cfg(), {"chunk": 32}, sweep / "0")


PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "cpu" / "cpu-small.csv"
PROFILE_DAMAGE = {
    "empty": lambda text: "",
    "bad header": lambda text: "a,b,c\n1,2,3\n",
    "nan": lambda text: text.replace(text.splitlines()[1], text.splitlines()[1].rsplit(",", 1)[0] + ",nan", 1),
    "latin-1": lambda text: text.splitlines()[0] + "\n\xe9\xe8,1,2\n",
    "truncated": lambda text: text[: len(text) // 3].rsplit(",", 1)[0],
}


@pytest.mark.parametrize("damage", sorted(PROFILE_DAMAGE))
def test_a_damaged_profile_is_refused_in_one_line_naming_it(damage, tmp_path):
    from sarathi_lab.model import load_config
    from sarathi_lab.sim.profile_model import ProfileCostModel

    bad = tmp_path / "cpu-small.csv"
    text = PROFILE_DAMAGE[damage](PROFILE.read_text())
    bad.write_bytes(text.encode("latin-1" if damage == "latin-1" else "utf-8"))
    with pytest.raises(ConfigError, match=rf"^sim_cost_model='profile' is invalid here: the profile {bad} is "
                                          r"unreadable \(.*\); run task=profile again$"):
        ProfileCostModel.from_csv(bad, load_config("tiny"), "float32")


def test_capacity_searches_name_a_damaged_capacity_json_and_go_on(tmp_path, caplog):
    from sarathi_lab.analysis.capacity import CAPACITY_JSON, load_searches

    good, bad = tmp_path / "a", tmp_path / "b"
    for run in (good, bad):
        _write_run(run, 32)
    found = {"slo": {"tbt_p99_s": 0.2, "sched_delay_p50_s": 1.0}, "capacity_rps": 2.0, "resolution": 0.04,
             "binding": "tbt_p99_s", "bounded": True, "trials": [{}, {}]}
    (good / CAPACITY_JSON).write_text(json.dumps(found))
    (bad / CAPACITY_JSON).write_text(json.dumps(found)[:30])
    with caplog.at_level(logging.WARNING):
        searches = load_searches(tmp_path)
    assert searches.run_dir.tolist() == [str(good)] and f"{bad / CAPACITY_JSON} (or its metrics.json)" in caplog.text


def test_the_notebooks_figures_and_claims_go_past_an_experiment_whose_every_run_is_truncated(sweep, caplog):
    # figures.ipynb's cells: each result's figure, then the claims table. A sweep whose only run's
    # metrics.json is truncated stopped the claims cell with an IndexError naming no file.
    from sarathi_lab.analysis import claims, registry

    for job in ("1", "2"):
        shutil.rmtree(sweep / job)
    bad = sweep / "0" / METRICS
    DAMAGE["truncated"](bad)
    results = Results(sweep.parents[2], include_unreliable=True)
    with caplog.at_level(logging.WARNING):
        assert "1 run unreadable (0)" in results.nothing_kept_note("pd_ratio")
        registry.draw(registry.by_name("pd_ratio"), results)
        (row,) = claims.claims_table(results, only=["pd_ratio"]).to_dict("records")
    assert row["holds"] == "n/a" and row["ours"] == "not judged: 1 run unreadable (0): left out"
    assert str(bad) in caplog.text
