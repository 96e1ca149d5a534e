"""The results contract: what a finished, a crashed and an interrupted run leave on disk, reruns
into the same directory, and load_runs."""
from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import torch

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.harness.compose import run_in_process
from sarathi_lab.harness.interrupts import Interrupted
from sarathi_lab.harness.progress import Progress
from sarathi_lab.harness.results import RunResult, clear_results, load_runs, result_files, write_results
from sarathi_lab.model.cpu_linear import aten_from_rows, describe, packed_gemm

TINY = ["experiment=smoke", "logger=none", "workload.num_requests=2", "seq_len=48", "pd_ratio=5"]
SUMMARY_KEYS = {"prefill_throughput_tok_s", "decode_throughput_tok_s", "total_throughput_tok_s", "makespan_s",
                "num_iterations", "kv_tokens_read",
                *(f"{m}_p{p}_s" for m in ("ttft", "itl", "e2el", "tpot", "sched_delay") for p in (50, 90, 99))}
# A key names its unit, or counts something its name says, or is a share or a flag.
UNITS = ("_s", "_ms", "_tok_s", "_rps", "_s_per_token", "_tokens", "_requests")
UNITLESS = {"iteration", "request_id", "kv_tokens_read", "num_preempted", "num_preemptions", "queue_at_arrival",
            "prefill_request_ids", "decode_request_ids", "preempted_request_ids",
            "saturated", "slo_attainment", "overhead_fraction", "preemptions_per_request"}


def _unitless(keys) -> list[str]:
    return [k for k in keys if not (k.endswith(UNITS) or k.startswith("num_") or k in UNITLESS)]


def _metrics() -> Metrics:
    it = IterationRecord(iteration=0, start=0.0, duration=0.1, num_prefill_tokens=8, num_decode_tokens=0,
                         num_prefill_requests=1, num_decode_requests=0, kv_tokens_read=8, num_preempted=0,
                         schedule_time=0.001, prepare_time=0.004, forward_time=0.09, sample_time=0.005)
    req = RequestRecord(request_id=0, prompt_len=8, arrival=0.0, output_len=1, first_scheduled=0.0,
                        first_token=0.1, finish=0.1, token_times=[0.1])
    return Metrics(iterations=[it], requests=[req])


def _tables() -> dict[str, pd.DataFrame]:
    m = _metrics()
    return {"iterations": pd.DataFrame(m.iteration_rows()), "requests": pd.DataFrame(m.request_rows())}


def _result(partial=False) -> RunResult:
    return RunResult(summary=_metrics().summary(), config={"chunk": 8}, environment={}, overrides=["chunk=8"],
                     resolved_config={"chunk": 8}, partial=partial, wall_time_s=0.1)


def test_a_finished_run_honours_the_contract(tmp_path):
    assert run_in_process([*TINY, "chunk=16"], tmp_path) == "ok"
    names = {p.name for p in tmp_path.iterdir()}
    assert {"metrics.json", "iterations.parquet", "requests.parquet"} <= names
    assert not [n for n in names if "partial" in n or ".tmp" in n]
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert SUMMARY_KEYS <= set(record["summary"]) and record["partial"] is False
    tables = [pd.read_parquet(tmp_path / f"{t}.parquet").columns for t in ("iterations", "requests")]
    assert _unitless([*record["summary"], *tables[0], *tables[1]]) == []
    assert record["config"]["chunk"] == 16 and record["config"]["scheduler"] == "sarathi"
    assert record["resolved_config"]["workload"]["num_requests"] == 2
    env = record["environment"]
    assert env["torch"] and env["device_name"] and env["device"] == "cpu" and "git_commit" in env
    assert isinstance(env["timing_unreliable"], bool) and env["cores"] >= 1 and "runqueue_wait_share" in env
    assert record["config"]["scale"] == "full" and record["config"]["executor"] == "model"
    # The GEMMs that ran, which cpu_linear=auto picks by the CPU.
    chosen, dtype = record["resolved_config"]["engine"]["cpu_linear"], getattr(torch, env["dtype"])
    gemm = packed_gemm(chosen, dtype)
    assert env["cpu_gemm"] == (describe(gemm, aten_from_rows(chosen, dtype, gemm)) if gemm else "aten")
    iterations = pd.read_parquet(tmp_path / "iterations.parquet")
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(iterations) == record["summary"]["num_iterations"] and len(requests) == 2
    assert iterations.num_prefill_tokens.sum() == record["summary"]["prefill_tokens"] == 2 * 40


def test_a_crash_while_writing_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    def disk_full(self, path, **kwargs):
        raise OSError("No space left on device")
    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)
    with pytest.raises(OSError):
        write_results(tmp_path, _tables(), _result())
    assert list(tmp_path.iterdir()) == []


def test_metrics_json_is_written_last(tmp_path, monkeypatch):
    order = []
    real_replace = __import__("os").replace
    monkeypatch.setattr("os.replace", lambda src, dst: (order.append(dst.name), real_replace(src, dst)))
    write_results(tmp_path, _tables(), _result())
    assert order[-1] == "metrics.json" and len(order) == 3


def test_an_interrupted_run_saves_partial_records_under_partial_names(tmp_path, monkeypatch):
    real_call = Progress.__call__

    def sigterm_on_third_iteration(self, record):
        real_call(self, record)
        if record.iteration == 2:
            raise Interrupted(15)
    monkeypatch.setattr(Progress, "__call__", sigterm_on_third_iteration)
    with pytest.raises(Interrupted):
        run_in_process(TINY, tmp_path)
    assert not (tmp_path / "metrics.json").exists()
    record = json.loads((tmp_path / "metrics.partial.json").read_text())
    assert record["partial"] is True and record["summary"]["num_iterations"] == 3
    assert len(pd.read_parquet(tmp_path / "iterations.partial.parquet")) == 3


def test_rerun_into_a_finished_run_refuses_by_default_skips_or_overwrites_on_request(tmp_path):
    run_in_process([*TINY, "chunk=16"], tmp_path)
    before = (tmp_path / "metrics.json").read_bytes()
    with pytest.raises(ConfigError, match=r"^on_existing=refuse: .* already holds a finished run; on_existing=skip"):
        run_in_process([*TINY, "chunk=16"], tmp_path)
    assert run_in_process([*TINY, "chunk=16", "on_existing=skip"], tmp_path) == "skipped"
    assert (tmp_path / "metrics.json").read_bytes() == before
    with pytest.raises(ConfigError, match=r"^on_existing=skip: .* holds a finished run of another config "
                                          r"\(chunk: 16 -> 8\); use another hydra.sweep.dir"):
        run_in_process([*TINY, "chunk=8", "on_existing=skip"], tmp_path)
    assert run_in_process([*TINY, "chunk=8", "on_existing=overwrite"], tmp_path) == "ok"
    assert json.loads((tmp_path / "metrics.json").read_text())["config"]["chunk"] == 8


def _tree(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", [["chunk=0"], ["engine.num_kv_blocks=2"], ["engine.max_model_len=4096"],
                                 ["seq_len=3000"]])
def test_overwrite_refused_by_any_check_keeps_the_finished_run_byte_for_byte(tmp_path, bad):
    run_dir = tmp_path / "run"
    run_in_process(TINY, run_dir)
    before = _tree(run_dir)
    with pytest.raises(ConfigError):
        run_in_process([*TINY, *bad, "on_existing=overwrite"], run_dir)
    assert _tree(run_dir) == before


def test_overwrite_that_fails_midway_keeps_the_finished_run_and_records_the_failure_beside_it(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_in_process(TINY, run_dir)
    before = _tree(run_dir)

    def crash(*args, **kwargs):
        raise RuntimeError("out of memory")
    monkeypatch.setattr("sarathi_lab.harness.runner._serve", crash)
    with pytest.raises(RuntimeError):
        run_in_process([*TINY, "chunk=8", "on_existing=overwrite"], run_dir)
    assert _tree(run_dir) == before
    failed = json.loads((tmp_path / ".run.next" / "status.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: out of memory"


def test_an_in_process_run_records_how_it_ended_as_the_cli_does(tmp_path, monkeypatch):
    assert run_in_process(TINY, tmp_path / "ok") == "ok"
    assert json.loads((tmp_path / "ok" / "status.json").read_text())["status"] == "ok"
    assert run_in_process([*TINY, "on_existing=skip"], tmp_path / "ok") == "skipped"
    assert json.loads((tmp_path / ".ok.next" / "status.json").read_text())["status"] == "skipped"

    def interrupt(*args, **kwargs):
        raise Interrupted(2)
    monkeypatch.setattr("sarathi_lab.harness.runner._serve", interrupt)
    with pytest.raises(Interrupted):
        run_in_process(TINY, tmp_path / "stopped")
    assert json.loads((tmp_path / "stopped" / "status.json").read_text())["status"] == "interrupted"


def test_overwrite_swaps_the_new_run_in_once_it_has_finished(tmp_path):
    run_dir = tmp_path / "run"
    run_in_process(TINY, run_dir)
    assert run_in_process([*TINY, "chunk=8", "on_existing=overwrite"], run_dir) == "ok"
    assert json.loads((run_dir / "metrics.json").read_text())["config"]["chunk"] == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "no staging or old copy left behind"


def test_load_is_judged_by_run_queue_waiting_not_by_idling():
    from sarathi_lab.host_load import LoadSnapshot, assess
    quiet = assess(LoadSnapshot(0, 0, 0.5), LoadSnapshot(10**9, 10**7, 1.0))
    assert quiet["timing_unreliable"] is False and quiet["timing_note"] is None
    assert quiet["runqueue_wait_share"] == pytest.approx(0.0099, abs=1e-4)
    busy = assess(LoadSnapshot(0, 0, 3.0), LoadSnapshot(10**9, 5 * 10**8, 4.0))
    assert busy["timing_unreliable"] is True and busy["timing_note"].startswith("timings unreliable: ")
    assert "\n" not in busy["timing_note"]
    no_schedstat = assess(LoadSnapshot(None, None, 64.0), LoadSnapshot(None, None, 64.0))
    assert no_schedstat["timing_unreliable"] is True


def test_a_simulated_run_says_so_in_its_summary_line_and_environment(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        assert run_in_process([*TINY, "executor=sim", "engine.sim_device=a100", "engine.sim_tp=2",
                               "engine.num_kv_blocks=64"], tmp_path) == "ok"
    env = json.loads((tmp_path / "metrics.json").read_text())["environment"]
    assert env["simulated"] is True and env["executor"] == "sim" and env["device"] == "sim:a100"
    assert (env["sim_device"], env["sim_cost_model"], env["sim_tp"]) == ("a100", "roofline", 2)
    assert env["device_name"] == "simulated 2x A100 (roofline cost model)" and env["host_device"] == "cpu"
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("results in")]
    assert "simulated 2x A100 (roofline cost model), " in line and "tok/s total" in line


def test_a_measured_run_says_it_was_not_simulated_and_which_package_ran(tmp_path):
    assert run_in_process(TINY, tmp_path) == "ok"
    env = json.loads((tmp_path / "metrics.json").read_text())["environment"]
    assert env["simulated"] is False and env["executor"] == "model" and "sim_device" not in env
    assert "sarathi_lab_version" in env


def test_an_installed_copy_records_its_version_and_the_commit_pip_installed_it_from(monkeypatch):
    from importlib import metadata

    from sarathi_lab import code_commit
    from sarathi_lab.harness import environment

    class Installed:  # what pip leaves for `pip install git+https://...@<commit>` (PEP 610)
        def read_text(self, name):
            return (json.dumps({"url": "https://example.org/sarathi_lab.git",
                                "vcs_info": {"vcs": "git", "commit_id": "abc123"}})
                    if name == "direct_url.json" else None)
    monkeypatch.setattr(code_commit, "_git", lambda *args: None)  # not a clone
    monkeypatch.setattr(metadata, "distribution", lambda name: Installed())
    monkeypatch.setattr(metadata, "version", lambda name: "9.9.9")
    env = environment.collect_environment(EngineConfig(), torch.device("cpu"), torch.float32, None, {})
    assert (env["sarathi_lab_version"], env["git_commit"], env["git_dirty"]) == ("9.9.9", "abc123", None)


def test_load_runs_gives_one_row_per_finished_run_with_swept_keys(tmp_path):
    for job in (0, 1, 2, 9, 10):
        (tmp_path / str(job)).mkdir()
    for job, overrides in enumerate([["chunk=8"], ["chunk=16"], ["chunk=16", "workload.num_requests=3"]]):
        write_results(tmp_path / str(job), _tables(), RunResult(
            summary=_metrics().summary(), config={"chunk": int(overrides[0][6:])}, environment={"torch": "x"},
            overrides=[*overrides, "hydra.launcher=basic"], resolved_config={"workload": {"num_requests": 3}},
            partial=False, wall_time_s=1.0))
    write_results(tmp_path / "9", _tables(), _result(partial=True))  # interrupted: not a run to compare
    # 10: crashed before writing anything
    runs = load_runs(tmp_path)
    assert runs.chunk.tolist() == [8, 16, 16] and runs["env.torch"].eq("x").all()
    assert runs["workload.num_requests"].isna().tolist() == [True, True, False]
    assert "hydra.launcher" not in runs and SUMMARY_KEYS <= set(runs.columns)
    iterations = load_runs(tmp_path, table="iterations")
    assert len(iterations) == 3 and iterations.chunk.tolist() == [8, 16, 16]
    assert load_runs(tmp_path / "nothing").empty


def test_a_group_choice_the_config_does_not_name_is_told_apart_by_its_resolved_keys(tmp_path):
    # workload=staggered records its kind, synthetic: its stagger (batch_size, resolved per job) is the
    # column that tells Orca's best case from the lock step; scheduler=orca is its own column, no more.
    workload = {"kind": "synthetic", "num_requests": 54, "stagger": 18}
    for job, (choice, stagger) in enumerate((("synthetic", 0), ("staggered", 18))):
        (tmp_path / str(job)).mkdir()
        write_results(tmp_path / str(job), _tables(), RunResult(
            summary=_metrics().summary(), config={"scheduler": "orca", "workload": "synthetic"},
            environment={}, overrides=[f"workload={choice}", "scheduler=orca", "setup=a6000_13b_1k"],
            resolved_config={"workload": workload | {"stagger": stagger}, "scheduler": {"name": "orca"}},
            partial=False, wall_time_s=1.0))
    runs = load_runs(tmp_path)
    assert runs.workload.tolist() == ["synthetic", "synthetic"]
    assert runs["workload.stagger"].fillna(0).tolist() == [0, 18]
    assert not any(c.startswith("scheduler.") for c in runs) and "setup" in runs


def test_load_runs_reads_a_run_written_before_names_carried_units(tmp_path):
    # The names such a run wrote, spelled out here rather than taken from results.RENAMED.
    old_summary = {"total_throughput": 100.0, "ttft_p50": 0.5, "tbt_p99": 0.05, "e2e_p90": 2.0, "makespan_s": 3.0}
    (tmp_path / "a_old").mkdir()
    (tmp_path / "b_new").mkdir()
    write_results(tmp_path / "a_old", {"iterations": pd.DataFrame({"iteration": [0], "duration": [0.1],
                                                                  "forward_time": [0.09]}),
                                     "requests": pd.DataFrame({"request_id": [0], "ttft": [0.5], "e2e": [2.0]})},
                  RunResult(summary=old_summary, config={"chunk": 8}, environment={}, overrides=[],
                            resolved_config={}, partial=False, wall_time_s=1.0))
    write_results(tmp_path / "b_new", _tables(), _result())
    runs = load_runs(tmp_path)
    assert runs.total_throughput_tok_s.tolist()[0] == 100.0 and runs.itl_p99_s.tolist()[0] == 0.05
    assert runs.ttft_p50_s.tolist()[0] == 0.5 and runs.e2el_p90_s.tolist()[0] == 2.0
    assert not {"total_throughput", "ttft_p50", "tbt_p99"} & set(runs.columns)
    its = load_runs(tmp_path, table="iterations")
    assert {"duration_s", "forward_s"} <= set(its.columns) and "duration" not in its.columns
    assert its.duration_s.notna().all()
    reqs = load_runs(tmp_path, table="requests")
    assert {"ttft_s", "e2el_s"} <= set(reqs.columns) and reqs.ttft_s.notna().all()


def test_a_measurement_task_lands_its_own_tables_behind_the_same_contract(tmp_path, monkeypatch):
    def fake_task(cfg, llm):
        return {"tile_jump": 1.5}, {"iteration_times": pd.DataFrame({"tokens": [8, 16], "ms": [1.0, 1.5]})}
    monkeypatch.setattr("sarathi_lab.harness.runner.measurement", lambda task: fake_task)
    assert run_in_process([*TINY, "task=iteration_sweep"], tmp_path) == "ok"
    assert {p.name for p in tmp_path.glob("*.parquet")} == {"iteration_times.parquet"}
    runs = load_runs(tmp_path)
    assert runs.task.tolist() == ["iteration_sweep"] and runs.tile_jump.tolist() == [1.5]
    assert load_runs(tmp_path, table="iteration_times").ms.tolist() == [1.0, 1.5]


def test_clear_results_removes_complete_and_partial_files(tmp_path):
    write_results(tmp_path, _tables(), _result(partial=True))
    write_results(tmp_path, _tables(), _result())
    assert len(result_files(tmp_path)) == 6
    clear_results(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_preemptions_are_expected_only_when_the_requests_there_at_once_overflow_the_kv_cache(tmp_path, caplog):
    # Two requests of 48 tokens fill 6 blocks: a batch_size of 8 never holds more than those two.
    with caplog.at_level(logging.WARNING):
        assert run_in_process([*TINY, "batch_size=8", "engine.num_kv_blocks=6"], tmp_path / "fits") == "ok"
    assert "expect preemptions" not in caplog.text
    assert json.loads((tmp_path / "fits" / "metrics.json").read_text())["summary"]["num_preemptions"] == 0
    with caplog.at_level(logging.WARNING):
        run_in_process([*TINY, "batch_size=8", "engine.num_kv_blocks=4"], tmp_path / "overflows")
    assert "cannot hold 2 requests of 48 tokens: expect preemptions" in caplog.text


def test_outside_a_clone_the_checkout_state_is_unknown_not_clean(monkeypatch):
    from sarathi_lab import code_commit
    from sarathi_lab.harness import environment
    monkeypatch.setattr(code_commit, "_run_git", lambda *args: None)  # an installed copy, or no git
    env = environment.collect_environment(EngineConfig(), torch.device("cpu"), torch.float32, None, {})
    assert env["git_commit"] is None and env["git_dirty"] is None


def test_a_run_into_a_directory_another_run_is_writing_is_refused(tmp_path):
    # Two runs started in the same second share the default ${now:...} directory: the later one would
    # clear and overwrite the other's records, and each would report them as its own.
    from sarathi_lab.harness.runner import RunContext, claim_status_dir
    first = RunContext(output_dir=tmp_path / "run", overrides=[], group=None)
    claim_status_dir(first)
    with pytest.raises(ConfigError, match=r"run is in use: another run is writing there now"):
        run_in_process(TINY, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [], "nothing of the refused run"
    first.release()
    assert run_in_process(TINY, tmp_path / "run") == "ok"
