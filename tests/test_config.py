"""Config composition and validation: every bad value stops the run before any work with one line
naming the key, the value and what is allowed."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.scheduler import knob_names, scheduler_class, scheduler_names
from sarathi_lab.harness import CONF_DIR, experiment_variants
from sarathi_lab.harness.cli_check import _group_options, check_command_line, sweep_note
from sarathi_lab.harness.compose import compose_config, run_in_process
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import (
    CapacityCfg,
    DeviceCfg,
    ExportCfg,
    LoggerCfg,
    MeasureCfg,
    SLOCfg,
    WorkloadCfg,
    parse_config,
)
from sarathi_lab.harness.tasks import kv_requests
from sarathi_lab.host_features import usable_cores
from sarathi_lab.model import load_config
from sarathi_lab.plan import build_scheduler, plan_engine, probe_host
from tests.kv_plans import sim_blocks

SMOKE = ["experiment=smoke", "logger=none"]
SIM = [*SMOKE, "executor=sim"]
AUTO_33B = [*SIM, "model=llama-33b", "scheduler=sarathi_serve", "token_budget=auto", "slo.tbt_p99_s=100"]


def _check(overrides):
    """Everything run_experiment checks before deleting or allocating anything."""
    preflight(parse_config(compose_config(overrides)))


def test_default_config_is_valid_and_sweepable_by_bare_name():
    cfg = parse_config(compose_config(["chunk=256", "batch_size=4", "seq_len=512", "pd_ratio=3", "seed=7"]))
    assert (cfg.chunk, cfg.batch_size, cfg.seq_len, cfg.pd_ratio, cfg.seed) == (256, 4, 512, 3.0, 7)
    assert cfg.logger.kind == "wandb" and cfg.scheduler.name == "sarathi"
    # The run's knobs land in the engine's own config: chunk is sarathi's chunk and sarathi_serve's budget.
    engine = cfg.engine
    assert (engine.chunk_size, engine.max_batch_size, engine.seed) == (256, 4, 7)
    assert (engine.model, engine.scheduler, engine.executor) == ("cpu-small", "sarathi", "model")


def test_every_group_option_composes():
    for group in ("model", "scheduler", "workload", "device", "logger", "executor", "scale", "experiment", "setup"):
        for option in _group_options(CONF_DIR / group):
            if (group, option) == ("device", "cuda") and not torch.cuda.is_available():
                continue  # refused here: test_cuda_without_a_gpu_is_refused
            extra = ["model.path=/some/dir"] if option == "hf" else []
            # vLLM's engine runs only its own two schedulers (sarathi_lab/executors.py), not the default.
            extra += ["scheduler=sarathi_serve"] if (group, option) == ("executor", "vllm") else []
            composed = compose_config([f"{group}={option}", *extra])
            if composed.device.get("name") == "cuda" and not torch.cuda.is_available():
                # A multi-GPU experiment: its CPU dry run (device=cpu) must still compose and validate.
                composed = compose_config([f"{group}={option}", *extra, "device=cpu"])
            ranks = composed.engine.get("tensor_parallel", 1) * composed.engine.get("pipeline_parallel", 1)
            if ranks > usable_cores():  # more ranks than this machine has cores: refused in its one line
                with pytest.raises(ConfigError, match=f"needs {ranks} cores this process may run on here"):
                    probe_host(parse_config(composed).engine)  # the plan's probe, not the config's
                continue
            parse_config(composed)


def test_every_model_preset_is_a_model_choice():
    # README's CostModel example and bench.sim_speed use llama2-7b; `model=llama2-7b` must compose as the others do.
    from sarathi_lab.model.presets import PRESETS

    assert set(PRESETS) <= set(_group_options(CONF_DIR / "model"))


@pytest.mark.parametrize("option", sorted(o for o in _group_options(CONF_DIR / "experiment") if o.startswith("sim/")))
def test_every_simulated_experiment_sizes_its_kv_cache_on_its_device(option):
    # The simulator refuses a KV cache larger than its device unless asked for a what-if; the papers'
    # sweeps past an A6000's memory must ask (they had failed every job once the check came in).
    engine = parse_config(compose_config([f"experiment={option}"])).engine
    assert engine.executor == "sim"
    sim_blocks(engine, load_config(engine.model))


def test_the_simulated_decode_speedup_sweeps_fixed_and_tile_aligned_chunks():
    # One key: the run's own scheduler.chunk_align aligns task=piggyback's chunk, as it aligns a served one.
    sweep = experiment_variants.raw(CONF_DIR, "sim/decode_speedup")["hydra"]["sweeper"]["params"]
    assert str(sweep["scheduler.chunk_align"]) == "none,tile"
    for align, chunk in (("none", 256), ("tile", 256 - 17)):
        run = parse_config(compose_config(["experiment=sim/decode_speedup", "batch_size=18", "seq_len=3072",
                                           f"scheduler.chunk_align={align}"]))
        plan = preflight(run).plan
        assert kv_requests("piggyback", run, plan) == [chunk] + [3072] * 18


def test_the_piggyback_key_that_moved_is_refused_naming_the_one_that_aligns():
    assert check_command_line(["task=piggyback", "measure.chunk_align=tile"]) == (
        "measure.chunk_align=tile is invalid: measure.chunk_align is not a known key; nearest known keys: "
        "scheduler.chunk_align")
    with pytest.raises(ConfigError, match=r"^measure.chunk_align='tile' is invalid: measure.chunk_align is not a "
                                          r"known key; known keys here: measure.handoff_requests, "):
        parse_config(compose_config(["task=piggyback", "+measure.chunk_align=tile"]))


def test_a_profile_times_iterations_up_to_measure_max_tokens():
    # Schedulers that batch whole prompts (vllm, orca, static) build iterations far past chunk + batch_size.
    from sarathi_lab.measure.tasks.profile import grids

    for given, largest in (([], 32 + 4), (["measure.max_tokens=300"], 300)):
        run = parse_config(compose_config(["task=profile", "chunk=32", "batch_size=4", "seq_len=64", *given]))
        assert max(grids(run)["tokens"]) == largest


def test_the_executor_group_sets_the_simulator_and_its_knobs():
    cfg = parse_config(compose_config(["executor=sim", "engine.sim_device=a100"]))
    assert (cfg.engine.executor, cfg.engine.sim_device, cfg.engine.sim_cost_model) == ("sim", "a100", "roofline")
    assert parse_config(compose_config([])).engine.executor == "model"


def test_ci_experiments_are_the_full_ones_at_the_ci_scale():
    full = compose_config(["experiment=pd_ratio"], hydra=True)
    ci = compose_config(["experiment=ci/pd_ratio"], hydra=True)
    assert (ci.name, ci.scale, ci.model.name, ci.logger.kind, ci.measure.reps) == ("pd_ratio", "ci", "tiny", "none", 1)
    assert full.scale == "full" and full.model.name == "cpu-small"
    assert ci.hydra.sweeper.params.pd_ratio == "4,16" and ci.hydra.sweeper.params.scheduler == "static,sarathi"
    assert parse_config(compose_config(["experiment=ci/pd_ratio"])).key_values()["scale"] == "ci"


@pytest.mark.parametrize("experiment", ["capacity", "ci/capacity", "pd_ratio"])
def test_scale_ci_runs_what_it_says_whatever_model_the_experiment_picks(experiment):
    # experiment=capacity had picked cpu-small over scale=ci's tiny model: cpu-small labelled `scale: ci`.
    assert compose_config([f"experiment={experiment}"]).model.name == ("tiny" if "ci/" in experiment else "cpu-small")
    ci = compose_config([f"experiment={experiment}", "scale=ci"], hydra=True)
    assert (ci.scale, ci.model.name, ci.logger.kind, ci.measure.reps, ci.device.num_threads) == ("ci", "tiny", "none",
                                                                                                 1, 1)
    assert compose_config([f"experiment={experiment}", "scale=ci", "model=cpu-small"]).model.name == "cpu-small"


def test_a_trace_run_is_not_labelled_with_the_synthetic_lengths_it_did_not_use():
    keys = parse_config(compose_config(["workload=trace", "seq_len=512", "pd_ratio=8"])).key_values()
    assert keys["workload"] == "trace" and keys["seq_len"] is None and keys["pd_ratio"] is None
    keys = parse_config(compose_config(["workload=zipf", "seq_len=512", "pd_ratio=8"])).key_values()
    assert keys["seq_len"] == 512 and keys["pd_ratio"] == 8
    keys = parse_config(compose_config(["workload=trace", "seq_len=512", "task=op_breakdown"])).key_values()
    assert keys["seq_len"] == 512


def test_the_arxiv_capacity_search_runs_on_the_trace_lengths_with_drawn_arrivals():
    run = parse_config(compose_config(["experiment=capacity_sim_arxiv"]))
    assert (run.task, run.workload.kind, run.workload.arrival) == ("capacity", "trace_lengths", "poisson")
    assert run.workload.path.endswith("arxiv_summarization.csv") and run.engine.sim_cost_model == "calibrated"
    assert run.key_values()["seq_len"] is None


def test_experiment_resolves_from_the_top_level_experiments_folder():
    cfg = parse_config(compose_config(["experiment=smoke"]))
    assert cfg.name == "smoke" and cfg.model.name == "tiny" and cfg.chunk == 64
    # Command-line overrides still win over the experiment.
    assert parse_config(compose_config(["experiment=smoke", "chunk=32"])).chunk == 32


@pytest.mark.parametrize("overrides,line", [
    (["chunk=abc"], r"^chunk='abc' is invalid: must be of type int$"),
    (["batch_size=true"], r"^batch_size=True is invalid: must be of type int$"),
    (["pd_ratio=[1]"], r"^pd_ratio=\[1\] is invalid: must be of type float$"),
    (["chunk=0"], r"^chunk=0 is invalid: must be > 0$"),
    (["batch_size=-4"], r"^batch_size=-4 is invalid: must be > 0$"),
    (["workload.num_requests=0"], r"^workload.num_requests=0 is invalid: must be > 0$"),
    (["scheduler.name=fcfs"], r"^scheduler='fcfs' is invalid: allowed values are .*sarathi_serve"),
    (["model.name=gpt2"], r"^model.name='gpt2' is invalid: allowed values are tiny, cpu-small"),
    (["pd_ratio=nan"], r"^pd_ratio=nan is invalid: must be a finite number$"),
    (["pd_ratio=inf"], r"^pd_ratio=inf is invalid: must be a finite number$"),
    (["engine.kv_cache_gb=nan"], r"^engine.kv_cache_gb=nan is invalid: must be a finite number$"),
    (["engine.kv_watermark=1"], r"^engine.kv_watermark=1.0 is invalid: must be in \[0, 0.5\] \(the share"),
    (["engine.kv_watermark=0.999"], r"^engine.kv_watermark=0.999 is invalid: must be in \[0, 0.5\]"),
    (["engine.kv_watermark=-0.01"], r"^engine.kv_watermark=-0.01 is invalid: must be in \[0, 0.5\]"),
    (["engine.kv_watermark=nan"], r"^engine.kv_watermark=nan is invalid: must be a finite number$"),
    (["engine.kv_watermark=inf"], r"^engine.kv_watermark=inf is invalid: must be a finite number$"),
    (["engine.kv_cache_gb=inf"], r"^engine.kv_cache_gb=inf is invalid: must be a finite number$"),
    (["engine.kv_cache_gb=100000"], r"^engine.kv_cache_gb=100000 is invalid: \d+ blocks of \d+ bytes take"),
    (["engine.block_size=0"], r"^engine.block_size=0 is invalid: must be > 0$"),
    # A scheduler's own knobs: the other keys of its YAML, checked against its Config.
    (["scheduler=vllm", "scheduler.max_num_batched_tokens=0"],
     r"^scheduler.max_num_batched_tokens=0 is invalid: must be > 0$"),
    (["scheduler=vllm", "scheduler.max_num_batched_tokens=nan"],
     r"^scheduler.max_num_batched_tokens=nan is invalid: must be of type int$"),
    (["+scheduler.max_num_batched_tokenz=8"],
     # The registry's knobs, whichever schedulers it holds.
     (r"^scheduler.max_num_batched_tokenz=8 is invalid: no scheduler has this knob nor engine setting \(nearest: "
      rf"scheduler.max_num_batched_tokens=8\); allowed: {', '.join(sorted(knob_names()))}$")),
    (["+scheduler.chunk_size=8"], (r"^scheduler.chunk_size=8 is invalid: the run's config sets it by chunk; "
                                   r"allowed: chunk=8$")),
    (["+scheduler.block_size=8"], (r"^scheduler.block_size=8 is invalid: the run's config sets it by "
                                   r"engine.block_size; allowed: engine.block_size=8$")),
    (["+engine.max_num_batched_tokens=8"],
     r"^engine.max_num_batched_tokens=8 is invalid: the run's config sets it by scheduler.max_num_batched_tokens"),
    (["engine.cpu_linear=blas"], r"^engine.cpu_linear='blas' is invalid: allowed values are auto, mkl, onednn, aten$"),
    (["+engine.chunk_size=8"], (r"^engine.chunk_size=8 is invalid: the run's config sets it by chunk; allowed: "
                                r"chunk=8$")),
    (["workload=zipf", "workload.theta=nan"], r"^workload.theta=nan is invalid: must be a finite number$"),
    (["workload.arrival=poisson", "workload.qps=nan"], r"^workload.qps=nan is invalid: must be a finite number$"),
    (["workload.arrival=poisson", "workload.qps=inf"], r"^workload.qps=inf is invalid: must be a finite number$"),
    (["workload.arrival=poisson", "workload.qps=5e-324"], r"^workload.qps=5e-324 is invalid: the poisson arrival"),
    (["workload.arrival=gamma", "workload.cv=1e-160"], r"^workload.cv=1e-160 is invalid: the gamma arrival times"),
    (["workload.arrival=gamma", "workload.cv=1e200"], r"^workload.cv=1e\+200 is invalid: the gamma arrival times"),
    (["workload=trace", "workload.time_scale=nan"], r"^workload.time_scale=nan is invalid: must be a finite"),
    (["workload=trace", "workload.time_scale=-inf"], r"^workload.time_scale=-inf is invalid: must be a finite"),
    (["logger.init_timeout_s=nan"], r"^logger.init_timeout_s=nan is invalid: must be a finite number$"),
    (["logger.init_timeout_s=-1"], r"^logger.init_timeout_s=-1.0 is invalid: must be > 0$"),
    (["seed=-1"], r"^seed=-1 is invalid: must be in \[0, 2\*\*64 - 1\]$"),
    (["seed=18446744073709551616"], r"^seed=18446744073709551616 is invalid: must be in \[0, 2\*\*64 - 1\]$"),
    (["device.num_threads=0"], r"^device.num_threads=0 is invalid: must be > 0$"),
    ([*SMOKE, "engine.warmup_iters=5000"], r"^engine.warmup_iters=5000 is invalid: must be < the context of 2048"),
    ([*SMOKE, "engine.max_model_len=100", "engine.warmup_iters=100"], r"^engine.warmup_iters=100 is invalid"),
    ([*SMOKE, "engine.max_model_len=4096"], r"^engine.max_model_len=4096 is invalid: the model allows at most 2048$"),
    ([*SMOKE, "seq_len=1000000000000"], r"^seq_len=1000000000000 is invalid: more than the model's context of"),
    ([*SMOKE, "engine.num_kv_blocks=100000000"], r"^engine.num_kv_blocks=100000000 is invalid: 100000000 blocks"),
    # A measurement's batch of several requests, held at once: 4 x 10 blocks of decodes (+ 1 for the chunk).
    ([*SMOKE, "task=op_breakdown", "batch_size=4", "engine.num_kv_blocks=39"],
     r"^engine.num_kv_blocks=39 is invalid with task=op_breakdown: the KV cache holds 39 blocks, fewer than the 40"),
    ([*SMOKE, "task=piggyback", "batch_size=4", "engine.num_kv_blocks=40"],
     r"^engine.num_kv_blocks=40 is invalid with task=piggyback: the KV cache holds 40 blocks, fewer than the 44"),
    # profile holds one batch at a time; its largest is batch_size decodes of seq_len (4 x 10 blocks).
    ([*SMOKE, "task=profile", "engine.num_kv_blocks=39"],
     (r"^engine.num_kv_blocks=39 is invalid with task=profile: the KV cache holds 39 blocks, fewer than the 40 its "
      r"batch of 4 requests takes$")),
    # The default KV cache (batch_size requests of the context and the watermark, capped by memory) can be
    # too small too: piggyback's chunk beside batch_size decodes of the whole context, or a batch past
    # the memory cap.
    ([*SMOKE, "task=piggyback", "seq_len=2048", "chunk=256"],
     (r"^engine.num_kv_blocks=None is invalid with task=piggyback: the KV cache holds 517 blocks, fewer than the "
      r"528 its batch of 5 requests takes \(its default size; engine.num_kv_blocks sets it\)$")),
    ([*SMOKE, "task=op_breakdown", "batch_size=10000000", "seq_len=64"],
     (r"^engine.num_kv_blocks=None is invalid with task=op_breakdown: the KV cache holds \d+ blocks, "
      r"fewer than the 40000000 ")),
    # orca and static reserve the blocks of max_model_len tokens (here the model's 2048) for each request.
    ([*SMOKE, "scheduler=orca", "engine.num_kv_blocks=100"],
     (r"^engine.num_kv_blocks=100 is invalid with scheduler=orca: it reserves engine.max_model_len=2048 tokens \(128 "
      r"blocks\) for each request beside the 1 its engine.kv_watermark keeps free; allowed: >= 129 blocks, or a "
      r"smaller engine.max_model_len$")),
    ([*SIM, "scheduler=static", "engine.num_kv_blocks=100"],
     r"^engine.num_kv_blocks=100 is invalid with scheduler=static"),
    (["model=llama-33b", "dtype=float32"], r"^model='llama-33b' is invalid here: its weights take [\d.]+ GiB"),
    ([*SMOKE, "workload.num_requests=1000000000"], r"^workload.num_requests=1000000000 is invalid: its prompts need"),
    (["model=hf"], r"^model.path=\?\?\? is invalid: a value is required$"),
    (["workload.arrival=bursty"],
     r"^workload.arrival='bursty' is invalid: allowed values are all_at_once, poisson, gamma$"),
    (["dtype=int8"], r"^dtype='int8' is invalid: allowed values are"),
    (["task=nope"], r"^task='nope' is invalid: allowed values are serve, .*piggyback, pipeline_bubbles, profile"),
    (["measure.reps=0"], r"^measure.reps=0 is invalid: must be > 0$"),
    (["task=profile", "measure.max_tokens=0"], r"^measure.max_tokens=0 is invalid: must be > 0$"),
    (["task=piggyback", "batch_size=1"], r"^batch_size=1 is invalid with task=piggyback: B - 1 decodes must ride"),
    # Decodes alone past a tile: the scheduler would run the chunk as set; piggyback, timing the aligned one, refuses.
    (["task=piggyback", "chunk=2", "batch_size=20", "scheduler.chunk_align=tile", "scheduler.tile=16"],
     (r"^scheduler.chunk_align='tile' is invalid with task=piggyback, chunk=2, batch_size=20, scheduler.tile=16: "
      r"chunk \+ decodes = 2 \+ 19 = 21 tokens rounded down to whole 16-token tiles leaves no room for a chunk "
      r"beside 19 decodes; allowed: none, or a larger chunk$")),
    # sarathi's tile alignment (its knobs): a chunk that can never fill a tile is refused by the scheduler's check.
    (["scheduler.chunk_align=yes"], r"^scheduler.chunk_align='yes' is invalid: allowed values are auto, none, tile$"),
    (["chunk=16", "scheduler.chunk_align=tile"],
     (r"^scheduler.chunk_align='tile' is invalid with chunk=16, batch_size=4, scheduler.tile=128: a chunk and its "
      r"decodes \(at most 19 tokens\) never fill a whole tile; allowed: none, auto, or chunk=125 or more, or a "
      r"smaller tile$")),
    (["task=iteration_sweep", "seq_len=64", "measure.token_step=128"],
     r"^measure.token_step=128 is invalid with task=iteration_sweep: must be <= seq_len=64"),
    (["on_existing=maybe"], r"^on_existing='maybe' is invalid: allowed values are refuse, skip, overwrite$"),
    (["seq_len=8", "pd_ratio=100"], r"^seq_len=8 is invalid with pd_ratio=100.0: it gives 8 prompt and 0 decode"),
    (["seq_len=8", "pd_ratio=0.01"], r"^seq_len=8 is invalid with pd_ratio=0.01: it gives 0 prompt and 8 decode"),
    ([*SMOKE, "seq_len=3000"], r"^seq_len=3000 is invalid: more than the model's context of 2048 tokens$"),
    (["workload=trace", "workload.path=nowhere.csv"], r"^workload.path='nowhere.csv' is invalid: no such file"),
    # The simulator's device, cost model and KV cache, checked before a run deletes or builds anything.
    ([*SIM, "engine.sim_device=tpu"], r"^engine.sim_device='tpu' is invalid: allowed values are a100, "),
    ([*SIM, "model=llama-33b", "engine.sim_device=a6000"], r"^engine.sim_device='a6000' is invalid for this model"),
    ([*SIM, "engine.num_kv_blocks=10000000000"], r"^engine.num_kv_blocks=10000000000 is invalid: 10000000000 blocks"),
    ([*SIM, "engine.num_kv_blocks=2"], r"^engine.num_kv_blocks=2 is invalid: the KV cache holds 32 tokens, fewer"),
    ([*SIM, "model=mistral-7b", "chunk=100000000"],
     (r"^chunk=100000000 is invalid on engine.sim_device='h100': an iteration of this many tokens and a decode per "
      r"running request \(100000004 in all\) leaves no room for a KV cache$")),
    ([*SIM, "engine.sim_cost_model=profile", "engine.sim_device=a6000"],
     r"^engine.sim_cost_model='profile' is invalid here: no profile at .*run task=profile"),
    # chunk=64 leaves LLaMA-33B 465 blocks on an H100; the budget tuned for this lax SLO (65536) none.
    (AUTO_33B, (r"^token_budget=auto \(65536 tokens for slo.tbt_p99_s=100\) is invalid on engine.sim_device='h100': "
                r"an iteration of this many tokens and a decode per running request \(65540 in all\) leaves no room "
                r"for a KV cache; a lower slo.tbt_p99_s, or token_budget=null and a chunk that fits, leaves room$")),
])
def test_bad_values_give_one_line_naming_key_value_and_allowed(overrides, line):
    with pytest.raises(ConfigError, match=line) as err:
        _check(overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bf16_units, line", [
    # LLaMA-2-7B's 12.6 GiB in bfloat16: the 37.7 GiB are those and the CPU GEMM's two packed copies, and
    # the weights alone fit 20 GiB, so cpu_linear=aten is the way out.
    (True, (r"^model='llama2-7b' is invalid here: its weights take 12\.6 GiB in bfloat16 and the CPU GEMM's 2 "
            r"packed copies of them 25\.1 GiB more \(37\.7 GiB in all\), more than the 20\.0 GiB available on "
            r"cpu; allowed: engine\.cpu_linear=aten, which packs no copy \(12\.6 GiB in all; .*\), or a smaller "
            r"model or dtype$")),
    # Without bf16 units bfloat16 runs as float32: the line names the dtype that runs, whose weights
    # alone do not fit either.
    (False, (r"^model='llama2-7b' is invalid here: its weights take 25\.1 GiB in float32 and the CPU GEMM's 2 "
             r"packed copies of them 50\.2 GiB more \(75\.3 GiB in all\), more than the 20\.0 GiB available on "
             r"cpu; allowed: a smaller model or dtype$")),
])
def test_weights_are_refused_apart_from_the_cpu_gemms_packed_copies(monkeypatch, bf16_units, line):
    monkeypatch.setattr("sarathi_lab.model.memory.device_memory_bytes", lambda device: 20 * 2**30)
    monkeypatch.setattr("sarathi_lab.host_features.cpu_has_bf16_units", lambda: bf16_units)
    with pytest.raises(ConfigError, match=line):
        _check(["model=llama2-7b", "device=cpu"])
    if bf16_units:
        _check(["model=llama2-7b", "device=cpu", "engine.cpu_linear=aten"])  # the way out it names passes


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ConfigError, match=r"^device='cuda' is invalid: no CUDA device"):
        _check(["device=cuda"])


def test_a_kv_cache_too_small_for_orca_s_reservation_is_refused_before_the_weights(monkeypatch):
    import sarathi_lab.llm
    import sarathi_lab.model

    def no_weights(*args, **kwargs):
        raise AssertionError("the model was built before the refusal")

    # The engine imports build_model from the model package where it builds one.
    monkeypatch.setattr(sarathi_lab.model, "build_model", no_weights, raising=False)
    with pytest.raises(ConfigError, match=(r"^num_kv_blocks=100 is invalid with scheduler=orca: it reserves "
                                           r"max_model_len=2048 tokens \(128 blocks\) for each request beside the 1 "
                                           r"its kv_watermark keeps free; allowed: >= 129 blocks, or a smaller "
                                           r"max_model_len$")):
        sarathi_lab.llm.LLM("tiny", scheduler="orca", num_kv_blocks=100, device="cpu", dtype="float32")


def test_a_kv_cache_too_small_for_one_request_is_refused_before_generating(tmp_path):
    with pytest.raises(ConfigError, match=r"engine.num_kv_blocks=2 is invalid: the KV cache holds 32 tokens, "
                                          r"fewer than one request of 160$"):
        run_in_process([*SMOKE, "engine.num_kv_blocks=2"], tmp_path)
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("overrides,line", [([*SIM, "engine.sim_device=tpu"], r"^engine.sim_device='tpu' is invalid"),
                                           (AUTO_33B, r"^token_budget=auto \(65536 tokens")])
def test_a_refused_simulation_leaves_an_interrupted_run_s_partial_records(tmp_path, overrides, line):
    (tmp_path / "metrics.partial.json").write_text("{}")
    with pytest.raises(ConfigError, match=line):
        run_in_process(overrides, tmp_path)
    assert (tmp_path / "metrics.partial.json").exists()


@pytest.mark.parametrize("args,line", [
    (["scheduler=fcfs"], "scheduler='fcfs' is invalid: allowed values are " + ", ".join(sorted(scheduler_names()))),
    (["-m", "model=tiny,llama-70b"], ("model='llama-70b' is invalid: allowed values are cpu-small, falcon-180b, "
                                      "hf, llama-13b, llama-33b, llama2-70b, llama2-7b, mistral-7b, tiny, yi-34b")),
    (["experiment=nope"], "experiment='nope' is invalid: allowed values are "
                          + ", ".join(_group_options(CONF_DIR / "experiment"))),
])
def test_unknown_group_choices_are_caught_before_hydra_starts(args, line):
    assert check_command_line(args) == line


def test_known_choices_flags_and_plugin_groups_pass():
    assert check_command_line(["-m", "scheduler=sarathi,vllm", "experiment=null", "chunk=1,2",
                               "hydra/launcher=submitit_local", "scheduler=glob(*)"]) is None
    assert check_command_line(["--cfg", "job", "-cn", "config", "~engine.num_kv_blocks", "--unknown-flag"]) is None
    assert check_command_line(["--info", "plugins"]) is None
    # Two of Hydra's modes at once are its traceback ("Only one of --run, --multirun, --cfg, ..."): a line here.
    assert check_command_line(["-m", "chunk=1,2", "--cfg", "job"]).startswith("the command line is invalid: only one")


@pytest.mark.e2e
def test_cli_bad_value_exits_nonzero_with_one_line_and_no_result(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sarathi_lab.run", *SMOKE, "chunk=0", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "chunk=0" in line]
    assert len(errors) == 1 and errors[0].endswith("chunk=0 is invalid: must be > 0")
    assert not list(tmp_path.rglob("metrics*.json")) and not list(tmp_path.rglob("*.parquet"))


def test_the_config_names_what_the_engine_implements():
    # config.py is the bottom layer, so it names the attentions itself; the engine must build each.
    import torch

    from sarathi_lab.attention import make_backend
    from sarathi_lab.config import ATTENTIONS
    built = set()
    for name in ATTENTIONS:
        try:
            built.add(make_backend(name, torch.device("cpu")).name)
        except ModuleNotFoundError as e:  # Triton is the gpu extra's
            assert e.name == "triton"
            built.add(name)
    assert built | {"auto"} == set(ATTENTIONS)


def test_conf_repeats_the_dataclasses_defaults():
    # A default lives in its dataclass; conf/ repeats it so that --cfg job shows every key. They must
    # agree, or a run from the command line and one built in Python (LLM(), the tests) differ silently.
    run = parse_config(compose_config([]))
    assert (run.measure, run.capacity, run.slo, run.export) == (MeasureCfg(), CapacityCfg(), SLOCfg(), ExportCfg())
    assert run.logger == LoggerCfg(kind="wandb") and run.device == DeviceCfg(name=run.device.name)
    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    for path in (CONF_DIR / "config.yaml", *(CONF_DIR / "executor").glob("*.yaml")):
        given = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path).engine).items() if k != "executor"}
        assert given == {k: engine[k] for k in given}, path
    # What a workload is for (its request count, how they arrive and at what rate: a trace replays its
    # own by default) is its own, not a repeated default; `defaults` is Hydra's (azure_*.yaml extend trace.yaml,
    # staggered.yaml synthetic.yaml, whose stagger is what it is for).
    own = {"kind", "path", "num_requests", "arrival", "qps", "defaults"}
    workload = {f.name: f.default for f in dataclasses.fields(WorkloadCfg)}
    for path in (CONF_DIR / "workload").glob("*.yaml"):
        its = own | ({"stagger"} if path.stem == "staggered" else set())
        given = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k not in its}
        assert given == {k: workload[k] for k in given}, path


def test_every_registered_scheduler_and_only_those_have_a_yaml():
    yamls = {p.stem: OmegaConf.load(p).name for p in (CONF_DIR / "scheduler").glob("*.yaml")}
    assert set(yamls) == set(scheduler_names()) and all(stem == name for stem, name in yamls.items())


@pytest.mark.parametrize("name", scheduler_names())
def test_a_scheduler_s_yaml_holds_its_knobs_at_their_defaults(name):
    # Every knob of its Config that no engine setting gives, so that scheduler.KNOB= sets it by name.
    yaml = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "scheduler" / f"{name}.yaml"))
    config = scheduler_class(name).Config
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    assert {k: v for k, v in yaml.items() if k != "name"} == {k: defaults[k] for k in config.knobs()}


def test_a_scheduler_s_knob_flows_from_its_yaml_and_from_the_api_to_the_scheduler():
    engine = parse_config(compose_config([*SIM, "scheduler=vllm", "scheduler.max_num_batched_tokens=96"])).engine
    assert engine.scheduler_knobs == {"max_num_batched_tokens": 96}
    assert build_scheduler(plan_engine(engine)).config.max_num_batched_tokens == 96
    llm = LLM("tiny", scheduler="vllm", max_num_batched_tokens=96, executor="sim", chunk_size=32)
    assert llm.engine.scheduler.config.max_num_batched_tokens == 96 and llm.config.chunk_size == 32
    with pytest.raises(ConfigError, match=r"^chunk_sise=32 is invalid: no scheduler has this knob"):
        LLM("tiny", chunk_sise=32, executor="sim")


def test_sarathi_s_tile_alignment_flows_from_the_command_line_and_the_api():
    engine = parse_config(compose_config([*SIM, "scheduler.chunk_align=tile", "scheduler.tile=64"])).engine
    assert engine.scheduler_knobs == {"chunk_align": "tile", "tile": 64}
    config = build_scheduler(plan_engine(engine)).config
    assert (config.chunk_align, config.tile) == ("tile", 64)
    llm = LLM("tiny", chunk_align="tile", executor="sim", chunk_size=128)
    assert (llm.engine.scheduler.config.chunk_align, llm.engine.scheduler.config.tile) == ("tile", 128)


def test_one_scheduler_s_knob_is_ignored_by_the_others_of_a_sweep():
    # capacity_sim sets vllm's prompt cap for a sweep over four schedulers.
    for name in scheduler_names():
        cfg = parse_config(compose_config(["experiment=capacity_sim", f"scheduler={name}"]))
        assert cfg.scheduler.knobs["max_num_batched_tokens"] == 4096
        scheduler = build_scheduler(plan_engine(cfg.engine))
        assert getattr(scheduler.config, "max_num_batched_tokens", 4096) == 4096


@pytest.mark.parametrize("flag", [["--config-dir", "{dir}"], ["-cd", "{dir}"], ["hydra.searchpath=[file://{dir}]"]])
def test_configs_added_to_the_search_path_are_hydra_s_to_check(tmp_path, flag):
    # A user's own experiment beside the package's (an installed package's conf/ is not theirs to edit).
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\nname: mine\nmy_knob: 1\n")
    args = [f.format(dir=tmp_path) for f in flag]
    assert check_command_line([*args, "experiment=mine", "my_knob=2"]) is None
    assert check_command_line([*args, "experiment=mine", "chunk=8,16"]).startswith("chunk=8,16 is invalid without -m")
    assert sweep_note([*args, "experiment=mine", "--cfg", "job"]) is None


def test_an_experiment_that_does_not_exist_is_refused_not_ignored():
    # Hydra drops an unknown choice of an optional group: the default config would run in its place
    # wherever the CLI's own check does not stand in front (compose_config, run_in_process, -cd).
    with pytest.raises(MissingConfigException, match="Could not find 'experiment/pd_ratoi'"):
        compose_config(["experiment=pd_ratoi"])
