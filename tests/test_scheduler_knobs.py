"""The scheduler's knobs, typed once: plan_engine builds the scheduler's config a single time, and KV
planning, the CUDA graphs' sizes and the run read that one object; `chunk` is one engine setting."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarathi_lab import LLM
from sarathi_lab.config import ENGINE_FIELDS, ConfigError, EngineConfig
from sarathi_lab.engine.scheduler import SchedulerConfig, scheduler_names
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.preflight import preflight
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.llm import largest_iteration_tokens
from sarathi_lab.plan import build_scheduler, plan_engine, scheduler_config_of

SIM = ["experiment=smoke", "logger=none", "executor=sim"]


@pytest.fixture
def built(monkeypatch):
    """Every scheduler config built, in order: each one's __post_init__ reaches the base's."""
    made: list[SchedulerConfig] = []
    check = SchedulerConfig.__post_init__

    def counted(self):
        made.append(self)
        check(self)

    monkeypatch.setattr(SchedulerConfig, "__post_init__", counted)
    return made


@pytest.mark.parametrize("scheduler", scheduler_names())
def test_a_simulated_gpu_plans_its_kv_cache_and_runs_on_one_scheduler_config(built, scheduler):
    # A GPU's default KV cache is sized around the scheduler's largest iteration: the planner reads
    # the same config the run then schedules by, built once.
    llm = LLM("tiny", executor="sim", sim_device="a100", scheduler=scheduler, chunk_size=64, max_batch_size=4)
    assert len(built) == 1
    assert llm.engine.scheduler.config is llm.plan.scheduler_config is built[0]


def test_the_real_engine_sizes_its_graphs_and_runs_on_the_plans_config(built):
    llm = LLM("tiny", device="cpu", dtype="float32", scheduler="sarathi_serve", chunk_size=48, warmup_iters=1)
    assert len(built) == 1 and llm.engine.scheduler.config is llm.plan.scheduler_config
    # What mixed CUDA graphs are captured up to on a GPU: this config's largest iteration.
    assert largest_iteration_tokens(llm.engine.scheduler) == 48 + llm.config.max_batch_size


def test_the_harness_checks_and_runs_the_config_it_planned_with(built):
    checked = preflight(parse_config(compose_config([*SIM, "scheduler=sarathi_serve", "chunk=96"])))
    assert len(built) == 1
    # The run (LLM.from_plan) builds its scheduler over the preflight's plan: no second config.
    assert build_scheduler(checked.plan).config is checked.plan.scheduler_config
    assert len(built) == 1


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["sarathi", "sarathi_serve"]), st.integers(1, 8192))
def test_chunk_is_one_engine_setting_that_each_chunking_scheduler_reads(scheduler, chunk):
    engine = parse_config(compose_config([*SIM, f"scheduler={scheduler}", f"chunk={chunk}"])).engine
    config = scheduler_config_of(engine, 8192)
    tokens = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    # sarathi's chunk_size, sarathi_serve's token_budget: both the run's chunk, through chunk_size.
    assert tokens.get("chunk_size", tokens.get("token_budget")) == chunk == engine.chunk_size


def test_the_engine_has_no_second_name_for_the_token_budget():
    assert "token_budget" not in ENGINE_FIELDS and not hasattr(EngineConfig(), "budget")
    with pytest.raises(ConfigError, match=r"^token_budget=96 is invalid: no scheduler has this knob"):
        plan_engine(EngineConfig("tiny", executor="sim", scheduler="sarathi_serve",
                                 scheduler_knobs={"token_budget": 96}))


# One refusal each from the engine's config, the model's limits, the KV planner, the scheduler's config
# and the scheduler's cache check: raised where each is checked, naming the key as it was set, by the
# run's config (a run's overrides) and by LLM's keyword arguments alike.
REFUSALS = [
    (["engine.block_size=0"], {"block_size": 0}, "engine.block_size=0", "block_size=0"),
    (["batch_size=0"], {"max_batch_size": 0}, "batch_size=0", "max_batch_size=0"),
    (["engine.max_model_len=4096"], {"max_model_len": 4096}, "engine.max_model_len=4096", "max_model_len=4096"),
    (["model=mistral-7b", "chunk=100000000"], {"model": "mistral-7b", "chunk_size": 100000000},
     "chunk=100000000 is invalid on engine.sim_device='h100'", "chunk_size=100000000 is invalid on sim_device='h100'"),
    (["scheduler=vllm", "scheduler.max_num_batched_tokens=0"], {"scheduler": "vllm", "max_num_batched_tokens": 0},
     "scheduler.max_num_batched_tokens=0", "max_num_batched_tokens=0"),
    (["chunk=16", "batch_size=4", "scheduler.chunk_align=tile"], {"chunk_size": 16, "max_batch_size": 4,
                                                                   "chunk_align": "tile"},
     "scheduler.chunk_align='tile' is invalid with chunk=16, batch_size=4, scheduler.tile=128",
     "chunk_align='tile' is invalid with chunk_size=16, max_batch_size=4, tile=128"),
    (["scheduler=orca", "engine.num_kv_blocks=100"], {"scheduler": "orca", "num_kv_blocks": 100},
     "engine.num_kv_blocks=100 is invalid with scheduler=orca: it reserves engine.max_model_len=2048",
     "num_kv_blocks=100 is invalid with scheduler=orca: it reserves max_model_len=2048"),
]


@pytest.mark.parametrize(("overrides", "kwargs", "as_run", "as_llm"), REFUSALS)
def test_a_refusal_names_the_key_as_it_was_set_where_it_is_checked(overrides, kwargs, as_run, as_llm):
    with pytest.raises(ConfigError) as run:
        preflight(parse_config(compose_config([*SIM, "model=tiny", *overrides])))
    settings = {"model": "tiny", "executor": "sim", "sim_device": "h100"} | kwargs
    with pytest.raises(ConfigError) as llm:
        LLM(settings.pop("model"), **settings)
    assert str(run.value).startswith(as_run) and "\n" not in str(run.value)
    assert str(llm.value).startswith(as_llm)


def test_the_core_takes_no_keys_and_a_refusal_is_named_once_at_the_edge():
    # The core names settings by their fields; the edge (LLM, the run) writes the user's keys, once.
    import inspect

    from sarathi_lab.config import named_as
    from sarathi_lab.engine.scheduler import base
    from sarathi_lab.harness.schema import RUN_KEYS
    from sarathi_lab.model.parallel import sharding, stages
    from sarathi_lab.sim import cost_model, profile_model, roofline

    core = [sharding.TensorShards.of, sharding.rank_memory_config, stages.Stage.of, base.scheduler_class,
            base.scheduler_config, base.SchedulerConfig.of, cost_model.CostModel.for_device,
            profile_model.ProfileCostModel.from_csv, roofline.CalibratedRooflineCostModel]
    assert [f for f in core if "keys" in inspect.signature(f).parameters] == []
    with pytest.raises(ConfigError) as raised, named_as(RUN_KEYS), named_as(RUN_KEYS.__class__()):
        base.scheduler_config("sarathi", {"tile": 0}, max_batch_size=1, max_model_len=8, chunk_size=8)
    assert str(raised.value) == "tile=0 is invalid: must be > 0"  # the innermost edge's words


def test_every_key_a_run_refusal_names_is_one_the_run_config_has():
    # A refusal is only useful if the key it names can be set as written.
    from omegaconf import OmegaConf

    from sarathi_lab.harness.schema import RUN_KEYS

    composed = compose_config(["executor=sim"])
    missing = object()
    named = {RUN_KEYS(setting) for setting in ENGINE_FIELDS}
    assert {key for key in named if OmegaConf.select(composed, key, default=missing) is missing} == set()
    assert "chunk" in named and "engine.block_size" in named and "chunk_size" not in named


def test_the_ranks_refuse_a_model_they_cannot_split_naming_the_runs_keys():
    # Checked deep in the plan (the model's shapes against the ranks), still named as the run set it.
    from sarathi_lab.config import named_as
    from sarathi_lab.harness.schema import RUN_KEYS
    from sarathi_lab.model import PRESETS
    from sarathi_lab.model.parallel.sharding import rank_memory_config
    from sarathi_lab.model.parallel.stages import Stage

    with pytest.raises(ConfigError, match=r"^engine.tensor_parallel=3 is invalid for model='tiny': its "), \
            named_as(RUN_KEYS):
        rank_memory_config(PRESETS["tiny"], 3, "tiny")
    with pytest.raises(ConfigError, match=r"^pipeline_parallel=9 is invalid for model='tiny': it has 4 layers"):
        Stage.of(4, 9, 0, "tiny")


@pytest.mark.parametrize("args, expected", [
    # A sweep over schedulers: the knob vllm has and sarathi lacks is added where it is missing.
    (["-m", "scheduler=vllm,sarathi", "scheduler.max_num_batched_tokens=512"],
     ["-m", "scheduler=vllm,sarathi", "+scheduler.max_num_batched_tokens=512"]),
    # The experiment's own sweep over schedulers too.
    (["-m", "experiment=scheduler_latency", "scheduler.max_num_batched_tokens=512"],
     ["-m", "experiment=scheduler_latency", "+scheduler.max_num_batched_tokens=512"]),
    # Written with + already, one scheduler, no sweep, or a knob every swept scheduler has: as typed.
    (["-m", "scheduler=vllm,sarathi", "+scheduler.max_num_batched_tokens=512"], None),
    (["-m", "scheduler=vllm", "scheduler.max_num_batched_tokens=512"], None),
    (["scheduler=vllm", "scheduler.max_num_batched_tokens=512"], None),
    (["-m", "scheduler=sarathi,sarathi_serve", "chunk=64,128"], None),
])
def test_a_knob_in_a_sweep_over_schedulers_needs_no_plus(args, expected):
    from sarathi_lab.harness.cli_check import added_knobs

    assert added_knobs(args) == (expected or args)


@pytest.mark.e2e
def test_the_sweep_over_schedulers_with_one_schedulers_knob_runs(tmp_path):
    import subprocess
    import sys

    from sarathi_lab.harness import REPO_ROOT

    proc = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=smoke", "scheduler=vllm,sarathi",
                           "scheduler.max_num_batched_tokens=512", "executor=sim", "logger=none",
                           f"hydra.sweep.dir={tmp_path}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_num_batched_tokens=512 is ignored by scheduler=sarathi" in proc.stdout + proc.stderr
    assert len(list(tmp_path.glob("*/metrics.json"))) == 2
