"""Hostile and newcomer inputs, each family through the entry point a user starts it by (in process, as
the command's own main or check does it): every refusal is one line naming the key at fault and the
true reason, before any work; nothing half-written is left; nothing is silently ignored."""
from __future__ import annotations

import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM, ConfigError, host_memory
from sarathi_lab.attention.backend import interpreted
from sarathi_lab.config import EngineConfig
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.harness.cli_check import check_command_line
from sarathi_lab.harness.schema import WorkloadCfg, parse_config
from sarathi_lab.harness.workloads import read_trace, resolve_trace_path
from sarathi_lab.measure.gpu.plan import STEPS
from sarathi_lab.model import memory
from sarathi_lab.plan import plan_engine
from tests.hf_models import save_random_model

ROOT = Path(__file__).resolve().parents[1]


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# --- memory: the process's own limits, and the key at fault --------------------------------------

def test_a_cgroup_limit_binds_below_the_machine_s_memory(monkeypatch, tmp_path):
    (tmp_path / "memory.max").write_text(f"{3 * 2**30}\n")
    (tmp_path / "memory.current").write_text(f"{2**30}\n")
    monkeypatch.setattr(host_memory, "_cgroup_dirs", lambda: [tmp_path])
    got = host_memory.available()
    assert got.bytes == 2 * 2**30 and "cgroup" in got.bound_by
    assert host_memory.total() <= 3 * 2**30
    (tmp_path / "memory.max").write_text("max\n")  # v2's "no limit"
    assert "cgroup" not in host_memory.available().bound_by


def test_an_address_space_limit_binds_and_is_named():
    # ulimit -v 4 GiB in a child (setting it here would bind the test process).
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30));"
            "from sarathi_lab import host_memory as h; m = h.available(); print(m.bytes, h.total(), m.bound_by)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    free, total, bound = done.stdout.split(maxsplit=2)
    assert int(free) < 4 * 2**30 and int(total) <= 4 * 2**30 and "RLIMIT_AS" in bound


def test_a_kv_cache_past_the_process_s_memory_is_one_line(monkeypatch):
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 5 * 10**9)
    with pytest.raises(ConfigError) as err:
        plan_engine(EngineConfig("tiny", device="cpu", kv_cache_gb=6.0))
    assert _one_line(err).startswith("kv_cache_gb=6.0 is invalid: ") and "GiB left on cpu" in str(err.value)


@pytest.mark.parametrize("kwargs, starts", [
    ({"max_model_len": 1}, "max_model_len=1 is invalid: the engine's warm-up generates 2 tokens"),
    ({"max_model_len": 2}, "max_model_len=2 is invalid"),
    ({"max_model_len": 64, "warmup_iters": 64}, "warmup_iters=64 is invalid: must be < the context of 64"),
    ({"block_size": 10**9}, "block_size=1000000000 is invalid: one block of KV cache takes"),
    ({"kv_watermark": 0.999}, "kv_watermark=0.999 is invalid: must be in [0, 0.5]"),
    ({"kv_watermark": 1.0}, "kv_watermark=1.0 is invalid: must be in [0, 0.5]"),
])
def test_refusals_name_the_key_at_fault(kwargs, starts):
    with pytest.raises(ConfigError) as err:
        plan_engine(EngineConfig("tiny", device="cpu", dtype="float32", **kwargs))
    assert _one_line(err).startswith(starts)


def test_a_billion_position_config_is_refused_for_its_context_not_its_weights(tmp_path):
    save_random_model("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 10**9}))
    with pytest.raises(ConfigError) as err:
        plan_engine(EngineConfig(str(tmp_path), device="cpu", dtype="float32"))
    assert _one_line(err).startswith(f"model='{tmp_path}' is invalid here: its config's context of 1000000000 "
                                     "positions (max_position_embeddings) needs ")
    assert "allowed: max_model_len=N, a shorter context" in str(err.value) and "weights take" not in str(err.value)


# --- the API: numpy numbers, misspelt settings, another scheduler's knob --------------------------

def test_numpy_numbers_are_taken_where_python_s_are():
    llm = LLM("tiny", executor="sim", max_batch_size=np.int64(4), chunk_size=np.int32(64), seed=np.uint64(3),
              kv_watermark=np.float32(0.25), cuda_graphs=np.bool_(False))
    assert (type(llm.config.chunk_size), llm.config.max_batch_size, llm.config.cuda_graphs) == (int, 4, False)
    out = llm.generate(np.array([[1, 2, 3]]), max_new_tokens=np.int64(2),
                       sampling=SamplingParams(temperature=np.float32(0.0), top_p=np.float32(0.9), seed=np.int64(1)))
    assert len(out[0]) <= 2
    with pytest.raises(ConfigError, match="must be of type int"):
        LLM("tiny", executor="sim", chunk_size=np.float64(2.5))


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk": 256}, "chunk=256 is invalid: no scheduler has this knob nor engine setting (nearest: chunk_size=256)"),
    ({"max_num_batched_tokens": 5},
     ("max_num_batched_tokens=5 is invalid: max_num_batched_tokens is a knob of scheduler=vllm, not of "
      "scheduler=sarathi; allowed: scheduler=vllm with it, or scheduler=sarathi's knobs: chunk_align, tile")),
    ({"scheduler": "orca", "tile": 64},
     "tile=64 is invalid: tile is a knob of scheduler=sarathi, not of scheduler=orca; allowed: "),
])
def test_a_misplaced_keyword_of_llm_is_named(kwargs, message):
    with pytest.raises(ConfigError) as err:
        LLM("tiny", executor="sim", **kwargs)
    assert _one_line(err).startswith(message)


@pytest.mark.parametrize("args, starts", [
    (["scheduler.max_num_batched_tokens=5"], ("scheduler.max_num_batched_tokens=5 is invalid: max_num_batched_tokens "
                                              "is a knob of scheduler=vllm, not of scheduler=sarathi")),
    # The same line as LLM's (the engine's refusal), the full key named whether set or added.
    (["+scheduler.max_num_batched_tokens=5"], ("scheduler.max_num_batched_tokens=5 is invalid: max_num_batched_tokens "
                                               "is a knob of scheduler=vllm, not of scheduler=sarathi")),
    (["scheduler=orca", "scheduler.tile=5"], "scheduler.tile=5 is invalid: tile is a knob of scheduler=sarathi"),
    (["-m", "chunk=32,64", "hydra.sweeper.max_batch_size=0"], "hydra.sweeper.max_batch_size=0 is invalid"),
    (["-m", "chunk=32,64", "hydra.sweeper.max_batch_size=1.5"], "hydra.sweeper.max_batch_size=1.5 is invalid"),
    (["-m", "chunk=32,64", "hydra.sweeper.repeat_ignored=maybe"],
     "hydra.sweeper.repeat_ignored='maybe' is invalid: allowed values are true, false"),
    (["-m", "chunk=32,64", "--cfg", "job"], "the command line is invalid: only one of --run, -m"),
])
def test_the_command_line_check_names_what_is_wrong(args, starts):
    assert (check_command_line(args) or "").startswith(starts)


@pytest.mark.parametrize("args", [["-m", "scheduler=sarathi,vllm", "+scheduler.max_num_batched_tokens=5"],
                                  ["scheduler=vllm", "scheduler.max_num_batched_tokens=5"],
                                  ["-m", "chunk=32,64", "hydra.sweeper.repeat_ignored=true"],
                                  ["-m", "chunk=32,64", "hydra.sweeper.max_batch_size=null"]])
def test_what_a_sweep_reads_passes(args):
    assert check_command_line(args) is None


# --- command lines: an empty value, a budget no step fits -----------------------------------------

@pytest.mark.parametrize("module, args", [
    ("sarathi_lab.measure.gpu.suite", ["--dry-run", "--out", ""]),
    ("sarathi_lab.measure.gpu.suite", ["--dry-run", "--out="]),
    ("sarathi_lab.analysis.timeline", ["RUN", "--out", ""]),
    ("sarathi_lab.analysis.publish", ["--measured", ""]),
])
def test_an_empty_option_value_is_refused(module, args, capsys, tmp_path):
    main = __import__(module, fromlist=["main"]).main
    with pytest.raises(SystemExit) as done:
        main([a.replace("RUN", str(tmp_path)) for a in args])
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --") and "='' is invalid: an empty value names nothing" in err[0]


@given(budget=st.floats(min_value=1e-12, max_value=min(s.minutes for s in STEPS), exclude_max=True))
@settings(max_examples=5, deadline=None)
def test_a_budget_no_step_fits_is_refused_before_anything_is_written(budget, tmp_path_factory):
    from sarathi_lab.measure.gpu.suite import main

    out = tmp_path_factory.mktemp("gpu") / "out"
    with pytest.raises(SystemExit) as done:
        main(["--budget-min", repr(budget), "--out", str(out)])
    assert done.value.code == 2 and not out.exists()


# --- workloads: a path that is no file, a field past a float ---------------------------------------

@pytest.mark.parametrize("where", ["dir", "/dev/null"])
def test_a_trace_path_that_is_no_regular_file_says_what_it_is(where, tmp_path):
    path = str(tmp_path) if where == "dir" else where
    with pytest.raises(ConfigError) as err:
        resolve_trace_path(path)
    assert ("is a directory" if where == "dir" else "not a regular file") in _one_line(err)


@given(digits=st.integers(310, 4000), column=st.sampled_from(["arrived_at", "num_prefill_tokens",
                                                              "num_decode_tokens"]))
@settings(max_examples=12, deadline=None)
def test_a_trace_field_past_a_float_is_one_line(digits, column, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    row = {"arrived_at": "0.5", "num_prefill_tokens": "12", "num_decode_tokens": "3"} | {column: "9" * digits}
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,4,2\n" + ",".join(row.values()) + "\n")
    with pytest.raises(ConfigError) as err:
        read_trace(WorkloadCfg(kind="trace", path=str(path), num_requests=None, qps=None))
    assert _one_line(err).startswith(f"workload.path='{path}' line 3: {column}=") and "characters" in str(err.value)


# --- task=profile: refused before measuring --------------------------------------------------------

def test_profile_on_the_simulator_is_refused():
    from sarathi_lab.harness.cli_check import compose_config

    with pytest.raises(ConfigError, match=r"^task=profile is invalid with executor=sim: "):
        parse_config(compose_config(["task=profile", "executor=sim", "logger=none"]))


def test_profile_past_the_context_names_the_setting():
    from sarathi_lab.harness.schema import MeasureCfg
    from sarathi_lab.measure.tasks import profile

    cfg = types.SimpleNamespace(chunk=64, batch_size=4, seq_len=64, measure=MeasureCfg(max_tokens=100_000))
    with pytest.raises(ConfigError, match=r"^measure.max_tokens=100000 is invalid with task=profile: .* past the "
                                          r"context of 2048 tokens; allowed: measure.max_tokens <= 2048$"):
        profile.check_context(cfg, 2048)
    cfg = types.SimpleNamespace(chunk=4000, batch_size=4, seq_len=64, measure=MeasureCfg())
    with pytest.raises(ConfigError, match=r"^chunk=4000 is invalid with task=profile"):
        profile.check_context(cfg, 2048)
    profile.check_context(types.SimpleNamespace(chunk=64, batch_size=4, seq_len=64, measure=MeasureCfg()), 2048)


@pytest.mark.parametrize("below", ["", "x/y"])
def test_a_profiles_dir_that_is_a_file_is_refused(below, tmp_path, monkeypatch):
    from sarathi_lab.measure.tasks import profile

    (tmp_path / "x").write_text("a file")
    monkeypatch.setenv("SARATHI_PROFILES_DIR", str(tmp_path / (below or "x")))
    with pytest.raises(ConfigError, match=r"^SARATHI_PROFILES_DIR=.* is invalid: it (is a file|lies under)"):
        profile.check_destination()


# --- analysis.timeline: its output and its input ---------------------------------------------------

def _run_dir(tmp_path: Path, drop: str | None = None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    its = pd.DataFrame({"iteration": [0, 1], "start_s": [0.0, 0.1], "duration_s": [0.1, 0.1],
                        "num_prefill_tokens": [4, 0], "num_decode_tokens": [0, 1], "num_prefill_requests": [1, 0],
                        "num_decode_requests": [0, 1]})
    reqs = pd.DataFrame({"request_id": [0], "prompt_tokens": [4], "output_tokens": [2], "arrival_s": [0.0]})
    its.drop(columns=[c for c in [drop] if c in its]).to_parquet(run / "iterations.parquet")
    reqs.drop(columns=[c for c in [drop] if c in reqs]).to_parquet(run / "requests.parquet")
    (run / "metrics.json").write_text(json.dumps({"config": {}, "summary": {}, "environment": {},
                                                  "resolved_config": {}, "overrides": []}))
    return run


@pytest.mark.parametrize("out, says", [("a_file/t.json", "which is a file, not a directory"),
                                       ("a_dir", "it is a directory")])
def test_timeline_out_that_cannot_be_a_file_is_one_line(out, says, tmp_path, capsys):
    from sarathi_lab.analysis import timeline

    run = _run_dir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    with pytest.raises(SystemExit) as done:
        timeline.main([str(run), "--out", str(tmp_path / out)])
    err = capsys.readouterr().err.splitlines()
    assert done.value.code == 2 and len(err) == 1 and says in err[0]
    assert not [p for p in tmp_path.rglob(".*tmp*")]


def test_a_failed_trace_write_leaves_no_temporary_file(tmp_path):
    from sarathi_lab.analysis.timeline import write_trace

    (tmp_path / "t.json").mkdir()  # rename onto a directory fails, after the temporary file is written
    with pytest.raises(OSError):
        write_trace({"traceEvents": []}, tmp_path / "t.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize("drop", ["duration_s", "arrival_s", "num_decode_requests"])
def test_a_run_whose_table_lacks_a_column_is_named(drop, tmp_path, capsys):
    from sarathi_lab.analysis import timeline

    with pytest.raises(SystemExit) as done:
        timeline.main([str(_run_dir(tmp_path, drop))])
    err = capsys.readouterr().err.splitlines()
    assert done.value.code == 2 and len(err) == 1 and f"lacks column {drop}" in err[0]


# --- publish's committed capacity tables ------------------------------------------------------------

@pytest.mark.parametrize("damage, says", [("no device", "it lacks column sim_device"),
                                          ("two devices", "its sim_device column holds 2 values")])
def test_a_capacity_table_that_is_not_one_is_refused_naming_it(damage, says, tmp_path):
    from sarathi_lab.analysis import capacity_docs

    folder = tmp_path / "capacity"
    folder.mkdir()
    table = pd.read_csv(ROOT / "docs" / "capacity" / "sim_capacity.csv")
    if damage == "no device":
        table = table.drop(columns=["sim_device"])
    else:
        table.loc[0, "sim_device"] = "h100" if table.sim_device.iloc[0] != "h100" else "a100"
    table.to_csv(folder / "sim_capacity.csv", index=False)
    with pytest.raises(capacity_docs.TableError) as err:
        capacity_docs.check_tables(tmp_path)
    assert _one_line(err).startswith(f"{folder / 'sim_capacity.csv'} is invalid: {says}")


# --- a newcomer's first hour: figures on a busy machine, warnings, notes ---------------------------

def test_a_result_whose_measured_runs_are_all_left_out_is_drawn_from_its_simulated_runs(tmp_path, monkeypatch):
    from sarathi_lab.analysis import registry
    from tests.test_registry import TOY, _toy_runs

    monkeypatch.setattr(registry, "RESULTS", (TOY,))
    measured = _toy_runs(tmp_path / "measured", [2.0, 3.0], unreliable={0, 1})
    simulated = _toy_runs(tmp_path / "sim", [4.0])
    fig = registry.draw(TOY, measured, simulated)
    assert fig.axes[0].patches[0].get_height() == pytest.approx(4.0)
    assert "measured runs left out: no reliable run of toy" in fig._suptitle.get_text()
    assert registry.draw(TOY, measured) is None  # nothing simulated: the line stands in its place


def test_attention_triton_on_a_cpu_is_said_to_run_the_interpreter():
    assert "Triton's interpreter" in interpreted("triton", torch.device("cpu"))
    assert interpreted("auto", torch.device("cpu")) is None and interpreted("torch", torch.device("cpu")) is None
    assert interpreted("triton", torch.device("cuda")) is None


def test_a_kv_capacity_spread_of_a_few_blocks_is_said_as_a_percentage():
    from sarathi_lab.harness.sweep import table_notes

    (note,) = table_notes(pd.DataFrame({"kv_capacity_tokens": [24736, 24816]}))
    assert "24736 to 24816 tokens (0.3% apart, 80 tokens;" in note


def test_the_progress_bar_grows_with_recomputed_tokens_without_a_warning():
    from sarathi_lab.harness.progress import Progress

    bar = Progress(10, 1, lambda: None, interactive=True)
    bar._interval_s = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            bar(types.SimpleNamespace(num_tokens=6))
    assert bar._bar.total == 18
    bar.close()
