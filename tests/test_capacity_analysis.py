"""analysis/capacity.py (the searches read back from disk, the capacity table) and the capacity result's
claims rows and figure (analysis/paper_results/capacity.py)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from sarathi_lab.analysis.capacity import capacity_table, compact, load_searches, write_csv
from sarathi_lab.analysis.claims import COLUMNS
from sarathi_lab.analysis.paper_results.capacity import CHECKS, Evidence, capacity_claims, chunked_prefill_overhead
from sarathi_lab.harness import REPO_ROOT


def _searches():
    rows = [("sarathi_serve", 0.1, 4.0), ("vllm", 0.1, 2.0), ("orca", 0.1, 1.0),
            ("sarathi_serve", 0.5, 6.0), ("vllm", 0.5, 4.0), ("orca", 0.5, 3.0)]
    return pd.DataFrame([{"scheduler": s, "tbt_slo_s": slo, "capacity_rps": c, "executor": "sim",
                          "model": "mistral-7b", "scale": "full"} for s, slo, c in rows])


def test_capacity_table_gives_the_gain_over_vllm_per_slo():
    table = capacity_table(_searches())
    assert list(table.index) == ["sarathi_serve", "vllm", "orca", "sarathi_serve / vllm"]
    assert table.loc["sarathi_serve / vllm"].tolist() == pytest.approx([2.0, 1.5])


CPU = {"source": "measured CPU, cpu-small (committed table)", "scale": "full", "dtype": "float32", "threads": "2",
       "machine": "Test CPU"}
SIM = {"source": "simulated roofline (a100, mistral-7b)", "scale": "full", "dtype": "", "threads": "n/a (simulated)",
       "machine": "none: predicted by the cost model"}


def _cpu_searches():
    return _searches().assign(executor="model", model="cpu-small", capacity_rps=lambda d: d.capacity_rps / 10,
                              device_name="Test CPU", dtype="float32", torch_threads=2, resolution=0.2)


def test_claims_rows_give_each_source_its_own_row_and_provenance():
    tradeoff = pd.DataFrame([{"scheduler": "sarathi_serve", "chunk": 512, "itl_p99_s": 0.05},
                             {"scheduler": "sarathi_serve", "chunk": 2048, "itl_p99_s": 0.2},
                             {"scheduler": "orca", "chunk": 512, "itl_p99_s": 1.0}]).assign(
        executor="sim", model="mistral-7b", scale="full")
    claims = capacity_claims(Evidence(searches=_cpu_searches(), provenance=CPU),
                             Evidence(_searches(), tradeoff, {1024: 0.1, 4096: 0.3}, provenance=SIM))
    assert list(claims.columns) == COLUMNS and set(claims.experiment) == {"capacity"}
    gain, hybrid, _overhead, sim_gain, sim_hybrid, sim_overhead = claims.to_dict("records")
    # 2x is 0.62 of the paper's 2.6x's effect, but its brackets reach 1.67x (0.42): unclear.
    assert gain["holds"] == "unclear" and "2.00x at P99 TBT <= 0.1 s" in gain["ours"] and "cpu-small" in gain["ours"]
    # Each capacity lies in [capacity, capacity x (1 + resolution)]: the ratio in [2 / 1.2, 2 x 1.2].
    assert gain["spread"] == "1.67x to 2.40x at P99 TBT <= 0.1 s (search brackets)"
    assert {k: gain[k] for k in CPU} == CPU and gain["left out"] == "none"
    assert (hybrid["ours"], hybrid["holds"], hybrid["source"]) == ("not measured yet", "n/a", CPU["source"])
    assert sim_gain["holds"] == "yes" and "mistral-7b, scale full" in sim_gain["ours"]
    assert {k: sim_gain[k] for k in SIM} == SIM
    # 20x of orca over stall-free batching: 0.7 of the paper's 28.3x's effect.
    assert sim_hybrid["ours"].startswith("20.0x") and sim_hybrid["holds"] == "yes"
    # Each claim states the criterion its verdict applies ("many-fold" did not).
    assert "2x or more" in hybrid["claim"]
    # No cost model named: judged as the paper's bound, +30% past its ~25%: the bound fails.
    assert sim_overhead["holds"] == "larger" and "+30.0% at 4096" in sim_overhead["ours"]
    assert sim_overhead["ours / paper"] == "largest: larger (1.2x)"
    (within,) = capacity_claims(Evidence(overhead={4096: 0.2}, provenance=SIM),
                                checks=CHECKS[2:]).to_dict("records")
    assert within["ours / paper"] == "largest: yes (0.8x)"
    # The roofline's overhead holds by construction: not judged.
    (roofline,) = capacity_claims(Evidence(overhead={1024: 0.02}, provenance=SIM, overhead_model="roofline"),
                                  checks=CHECKS[2:]).to_dict("records")
    assert roofline["holds"] == "n/a" and roofline["ours / paper"].startswith("by construction")


def test_claims_rows_without_evidence_say_so_and_a_simulated_source_without_any_has_none():
    claims = capacity_claims(Evidence(provenance=CPU), Evidence(provenance=SIM))
    assert len(claims) == 3 and set(claims.holds) == {"n/a"} and set(claims.source) == {CPU["source"]}


def test_searches_flagged_unreliable_are_left_out_and_counted():
    # vllm's strict search ran while other work shared the cores: without it there is no strict ratio,
    # and the relaxed one (6 / 4 over 10) is the one judged.
    searches = _cpu_searches().assign(timing_unreliable=lambda d: (d.scheduler == "vllm") & (d.tbt_slo_s == 0.1))
    (gain, *_) = capacity_claims(Evidence(searches=searches, provenance=CPU)).to_dict("records")
    assert gain["left out"] == "1 of 6 searches left out: timing unreliable"
    assert gain["ours"].startswith("1.50x at P99 TBT <= 0.5 s") and "0.1 s" not in gain["ours"]


def test_a_ratio_whose_search_brackets_allow_either_order_is_unclear():
    # 1.1x, but with 20% brackets sarathi_serve's capacity may be below vllm's.
    searches = _cpu_searches()
    searches.loc[(searches.scheduler == "sarathi_serve") & (searches.tbt_slo_s == 0.1), "capacity_rps"] = 0.22
    (gain, *_) = capacity_claims(Evidence(searches=searches, provenance=CPU)).to_dict("records")
    # Unresolved at the strict SLO, the one judged: no verdict.
    assert gain["ours"].startswith("1.10x at P99 TBT <= 0.1 s") and gain["holds"] == "unresolved"
    assert gain["spread"].startswith("0.92x to 1.32x")


def test_a_gain_of_unbounded_searches_is_no_verdict():
    # Both passed every rate tried: their ratio says nothing about which is larger.
    unbounded = _searches().assign(bounded=False, device_name="Test CPU", dtype="float32", torch_threads=2)
    (gain, *_) = capacity_claims(Evidence(searches=unbounded, provenance=CPU)).to_dict("records")
    assert gain["holds"] == "n/a" and "passed every rate" in gain["ours"]


def test_the_compact_table_of_the_simulated_searches_is_the_committed_one(tmp_path):
    committed = REPO_ROOT / "docs" / "capacity" / "sim_capacity.csv"
    shuffled = pd.read_csv(committed).sample(frac=1, random_state=0)
    assert write_csv(compact(shuffled), tmp_path / "sim.csv").read_text() == committed.read_text()


def test_chunked_prefill_overhead_against_a_linear_cost_with_a_fixed_part():
    class Linear:
        def iteration_time_s(self, prefills=(), decodes=(), num_sampled=None):
            sampled = len(prefills) + len(decodes) if num_sampled is None else num_sampled  # CostModel's default
            return 1.0 + sum(chunk for chunk, _ in prefills) + 10.0 * sampled

    # 4 chunks pay the fixed second 4 times instead of once, and only the last samples a row (10 s):
    # (4 + 2048 + 10) / (1 + 2048 + 10) - 1.
    assert chunked_prefill_overhead(Linear(), 2048, 512) == pytest.approx(3 / 2059)


def test_searches_load_from_their_capacity_json(tmp_path):
    # A search that died between its capacity.json and its metrics.json (written last) is unfinished.
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "capacity.json").write_text("{}")
    run = tmp_path / "0"
    run.mkdir()
    (run / "capacity.json").write_text(json.dumps({
        "capacity_rps": 3.0, "resolution": 0.05, "binding": "tbt_p99_s", "bounded": True,
        "trials": [{"rate_rps": 3.0, "passed": True}, {"rate_rps": 3.1, "passed": False}],
        "slo": {"tbt_p99_s": 0.1, "sched_delay_p50_s": 2.0}}))
    (run / "metrics.json").write_text(json.dumps({
        "config": {"scheduler": "vllm", "executor": "sim", "model": "mistral-7b", "scale": "full"},
        "summary": {"capacity_rps": 3.0, "token_budget": None, "at_capacity_itl_p99_s": 0.09},
        "overrides": [], "resolved_config": {},
        "environment": {"device_name": "Test CPU", "torch_threads": 2, "timing_unreliable": False}}))
    (row,) = load_searches(tmp_path).to_dict("records")
    assert row["capacity_rps"] == 3.0 and row["tbt_slo_s"] == 0.1 and row["num_trials"] == 2
    assert row["scheduler"] == "vllm" and row["at_capacity_itl_p99_s"] == 0.09
    assert row["device_name"] == "Test CPU" and row["torch_threads"] == 2


def test_a_search_written_before_its_rates_said_their_unit_reads_under_todays_names(tmp_path):
    """capacity.json, metrics.json and a trial's summary once named capacity_qps, lowest_failing_qps
    and qps; they read back as capacity_rps, lowest_failing_rps and rate_rps (results.RENAMED)."""
    from sarathi_lab.analysis.capacity_docs import read_table
    from sarathi_lab.harness.results import load_runs

    run = tmp_path / "0"
    (run / "trial-0-qps2").mkdir(parents=True)
    (run / "capacity.json").write_text(json.dumps({
        "capacity_qps": 2.0, "lowest_failing_qps": 2.1, "resolution": 0.05, "binding": "tbt_p99_s",
        "bounded": True, "trials": [{"qps": 2.0, "passed": True}],
        "slo": {"tbt_p99_s": 0.1, "sched_delay_p50_s": 2.0}}))
    record = {"config": {"scheduler": "vllm", "executor": "sim", "model": "mistral-7b", "scale": "full"},
              "summary": {"capacity_qps": 2.0, "token_budget": None}, "overrides": [], "resolved_config": {},
              "environment": {"device_name": "Test CPU", "torch_threads": 2, "timing_unreliable": False}}
    (run / "metrics.json").write_text(json.dumps(record))
    (run / "trial-0-qps2" / "metrics.json").write_text(json.dumps(
        record | {"config": {"trial": 0, "qps": 2.0}, "summary": {"qps": 2.0, "passed": 1.0}}))
    (row,) = load_searches(tmp_path).to_dict("records")
    assert row["capacity_rps"] == 2.0 and "capacity_qps" not in row
    runs = load_runs(run)
    assert runs.capacity_rps.dropna().tolist() == [2.0] and runs.rate_rps.dropna().tolist() == [2.0]
    assert "capacity_qps" not in runs
    old = tmp_path / "old.csv"
    old.write_text("scheduler,tbt_slo_s,capacity_qps\nvllm,0.1,2.0\n")
    assert read_table(old).capacity_rps.tolist() == [2.0]


def test_a_scheduler_whose_every_rate_failed_stays_in_the_table_and_loses_the_claim():
    # vllm's search failed even its lowest rate (capacity None) while sarathi_serve's passed 4 req/s:
    # sarathi_serve's capacity exceeds vllm's. The row used to vanish from the pivot, and the claim
    # read "not run" (vllm failing at both SLOs) or "nanx" with no verdict (at one).
    searches = _searches().assign(bounded=True)
    searches.loc[searches.scheduler == "vllm", "capacity_rps"] = None
    table = capacity_table(searches)
    assert "vllm" in table.index and table.loc["vllm"].isna().all()
    (gain, *_) = capacity_claims(Evidence(searches=searches, provenance=SIM)).to_dict("records")
    # sarathi_serve's is larger, by how much no search says: a direction without a size.
    assert gain["holds"] == "unclear" and "nan" not in gain["ours"]
    assert "vllm passed no rate tried at P99 TBT <= 0.1 s" in gain["ours"]
    strict_only = searches[~((searches.scheduler == "vllm") & (searches.tbt_slo_s == 0.5))]
    (gain, *_) = capacity_claims(Evidence(searches=strict_only, provenance=SIM)).to_dict("records")
    assert gain["holds"] == "unclear" and "0.5 s" not in gain["ours"]  # vllm not searched there


def test_the_capacity_figure_names_each_panels_source_and_quotes_the_paper_at_its_strict_slo_only():
    from sarathi_lab.analysis import capacity_docs
    from sarathi_lab.analysis.paper_results.capacity import capacity_figure

    sim, _, cpu = capacity_docs.load()  # the committed tables
    sim_ax, cpu_ax = capacity_figure(sim, cpu, capacity_docs.source(sim)).axes
    assert sim_ax.get_title().startswith("simulated A100 (roofline), mistral-7b: scale full")
    assert cpu_ax.get_title().startswith("measured CPU (")
    for ax in (sim_ax, cpu_ax):
        strict, relaxed = (label.get_text() for label in ax.get_xticklabels())
        # The paper's 2.6x is its strict SLO's gain: the relaxed SLO's group does not quote it.
        assert "paper 2.6x (its strict SLO)" in strict and "2.6x" not in relaxed, (strict, relaxed)
        assert "paper: no number at a relaxed SLO" in relaxed and ax.get_ylabel()
