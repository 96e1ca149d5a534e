"""LLM(executor="sim"): the engine's own scheduler, block manager and metrics on a virtual clock."""
from __future__ import annotations

import dataclasses
import random
import time

import pytest

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.model import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import CostModel
from tests.kv_plans import plan_blocks, sim_blocks


def workload(n: int, seed: int, qps: float = 20.0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(32000) for _ in range(rng.randint(50, 900))] for _ in range(n)]
    new_tokens = [rng.randint(1, 64) for _ in range(n)]
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(qps)
        arrivals.append(t)
    return prompts, new_tokens, arrivals


def simulate(scheduler: str = "sarathi", n: int = 40, seed: int = 0, **kwargs) -> LLM:
    llm = LLM("llama2-7b", executor="sim", sim_device="a100", scheduler=scheduler, chunk_size=256,
              max_batch_size=16, seed=seed, **kwargs)
    prompts, new_tokens, arrivals = workload(n, seed)
    llm.generate(prompts, new_tokens, arrival_times=arrivals)
    return llm


@pytest.mark.parametrize("scheduler", ["sarathi", "sarathi_serve", "vllm", "orca", "static"])
def test_same_seed_and_config_give_identical_runs(scheduler):
    a, b = simulate(scheduler), simulate(scheduler)
    assert ([dataclasses.asdict(r) for r in a.metrics.iterations]
            == [dataclasses.asdict(r) for r in b.metrics.iterations])
    assert [dataclasses.asdict(r) for r in a.metrics.requests] == [dataclasses.asdict(r) for r in b.metrics.requests]
    assert a.metrics.summary()["num_requests"] == 40


def test_a_simulated_run_never_sleeps_on_the_wall_clock(monkeypatch):
    def no_sleep(seconds):
        raise AssertionError(f"time.sleep({seconds}) in a simulated run")

    monkeypatch.setattr(time, "sleep", no_sleep)
    llm = simulate(n=30)   # Poisson arrivals at 20/s: the engine idles between some of them
    starts = [i.start for i in llm.metrics.iterations]
    assert starts == sorted(starts) and llm.metrics.summary()["makespan_s"] > 1.0


def test_each_iteration_takes_what_the_cost_model_predicts():
    llm = LLM("llama2-7b", executor="sim", sim_device="h100", scheduler="sarathi", chunk_size=128, max_batch_size=4)
    llm.generate([[5] * 300, [6] * 100], max_new_tokens=[3, 5])
    cm = CostModel.for_device("h100", model="llama2-7b")
    first, last = llm.metrics.iterations[0], llm.metrics.iterations[-1]
    # First: a 128-token chunk of the first prompt, nothing sampled; last: one decode.
    assert (first.num_prefill_tokens, first.num_decode_tokens) == (128, 0)
    assert first.duration == pytest.approx(cm.iteration_time_s(prefills=[(128, 128)], num_sampled=0), rel=1e-9)
    assert (last.num_prefill_tokens, last.num_decode_tokens) == (0, 1)
    assert last.duration == pytest.approx(cm.iteration_time_s(decodes=[104]), rel=1e-9)
    assert all(i.duration == pytest.approx(i.schedule_time + i.prepare_time + i.forward_time + i.sample_time)
               for i in llm.metrics.iterations)


def test_kv_capacity_follows_the_simulated_device_memory():
    small = LLM("llama-13b", executor="sim", sim_device="a6000", max_batch_size=18, chunk_size=256)
    big = LLM("llama-13b", executor="sim", sim_device="h200", max_batch_size=18, chunk_size=256)
    assert small.num_kv_blocks == sim_blocks(small.config, PRESETS["llama-13b"])
    assert 18 * 1024 <= small.kv_capacity_tokens < big.kv_capacity_tokens
    assert LLM("llama-13b", executor="sim", sim_device="a6000", num_kv_blocks=7).num_kv_blocks == 7


@pytest.mark.parametrize("key, value, blocks, size", [("num_kv_blocks", 10**7, 10**7, "122070.3"),
                                                       ("kv_cache_gb", 5000, 409600, "5000.0")])
def test_an_explicit_kv_cache_larger_than_the_simulated_device_is_refused(key, value, blocks, size):
    # As the real engine refuses one larger than its device (model/memory.py), before anything runs.
    # LLaMA-13B: 16 tokens x 40 layers x 2 x 5120 x 2 bytes per block; 26 GB of weights on a 48 GB A6000.
    with pytest.raises(ConfigError, match=rf"^{key}={value} is invalid: {blocks} blocks of 13107200 bytes take {size} "
                                          r"GiB, more than the 23\.7 GiB left on sim_device='a6000' beside the weights "
                                          r"\(sim_kv_beyond_device=true runs it as a what-if\)$"):
        LLM("llama-13b", executor="sim", sim_device="a6000", **{key: value})


def test_a_what_if_kv_cache_beyond_the_simulated_device_runs_when_asked(caplog):
    # The papers' sweeps past an A6000's memory (experiments/sim/decode_speedup.yaml): 3500 blocks
    # (42.7 GiB) beside LLaMA-13B's 26 GB of weights on a 48 GB card.
    with caplog.at_level("WARNING", logger="sarathi_lab.sim.build"):
        llm = LLM("llama-13b", executor="sim", sim_device="a6000", num_kv_blocks=3500, sim_kv_beyond_device=True)
    assert llm.num_kv_blocks == 3500
    assert "what-if KV cache" in caplog.text and "42.7 GiB" in caplog.text


def test_simulated_requests_run_to_their_token_budget():
    llm = simulate(n=10)
    assert [r.output_len for r in llm.metrics.requests] == workload(10, 0)[1]


def test_a_model_too_large_for_the_device_fails_with_one_line():
    from sarathi_lab.config import ConfigError

    with pytest.raises(ConfigError, match="sim_device='a6000' is invalid for this model"):
        sim_blocks(EngineConfig(model="llama-33b", executor="sim", sim_device="a6000", dtype="float32"),
                            PRESETS["llama-33b"])


def test_bfloat16_on_a_cpu_without_bf16_units_is_simulated_in_float32(monkeypatch):
    import torch

    # The engine runs bfloat16 as float32 there (the plan's dtype): its KV blocks and memory
    # traffic are 4 bytes an element, so the simulation's must be; the profile cost model already was.
    from sarathi_lab.sim import load_device

    monkeypatch.setattr("sarathi_lab.host_features.cpu_has_bf16_units", lambda: False)
    ceilings = dataclasses.replace(load_device("a100"), name="cpu")  # no measuring in a unit test
    monkeypatch.setattr("sarathi_lab.sim.device.cpu_device", lambda dtype="bfloat16": ceilings)
    cm = CostModel.for_device("cpu", "tiny", "roofline", "bfloat16")
    assert (cm.dtype, cm.elem_bytes) == ("float32", 4)
    cfg = EngineConfig(model="tiny", executor="sim", sim_device="cpu", dtype="bfloat16", kv_cache_gb=1.0)
    # tiny: 4 layers x (K and V) x 2 kv heads x 64 head dim x 4 bytes x 16 tokens a block, as the real
    # engine's plan_kv_blocks counts it in float32.
    assert sim_blocks(cfg, PRESETS["tiny"]) == 2**30 // (4 * 2 * 2 * 64 * 4 * 16)
    # ... and the plan says so, which the run's record reports as the dtype that ran.
    from sarathi_lab.plan import plan_engine

    assert plan_engine(cfg).dtype == torch.float32
    assert plan_engine(dataclasses.replace(cfg, sim_device="a100")).dtype == torch.bfloat16


@pytest.mark.parametrize(("reported", "slug"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A40", "a40"), ("NVIDIA RTX A6000", "a6000"),
    # Not an H200 (H100 compute beside more memory): its own folder, never borrowed figures.
    ("NVIDIA GH200 480GB", "nvidia-gh200-480gb"), ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090")])
def test_a_gpus_reported_name_maps_to_one_device_name(reported, slug):
    # The profile task (profiles/<device>/) and the GPU suite's collect (docs/gpu/<device>/) both
    # name a GPU by this; every simulated GPU is reachable from the name its driver reports.
    from sarathi_lab.config import device_slug
    from sarathi_lab.sim.device import GPU_DEVICES

    assert device_slug(reported) == slug
    assert {device_slug(f"NVIDIA {d.upper()}") for d in GPU_DEVICES} == set(GPU_DEVICES)


@pytest.mark.parametrize(("sim_device", "chunk"), [("a6000", 512), ("h100", 1024)])
def test_the_engine_and_the_simulator_plan_one_kv_cache_on_one_gpus_memory(sim_device, chunk):
    # One rule for both (model.memory), so that a simulated run admits and preempts as the real engine
    # would on that GPU: vLLM's share of memory less the weights and the largest iteration's activations.
    import torch

    from sarathi_lab.model.memory import context_limit
    from sarathi_lab.sim import load_device

    gpu, hf = load_device(sim_device), PRESETS["llama-13b"]
    # One config for both: the engine's planner reads no executor, and a float16 config that runs on
    # this machine's CPU would ask this CPU for float16 (which EngineConfig refuses where it has none).
    sim = EngineConfig(model="llama-13b", executor="sim", sim_device=sim_device, dtype="float16",
                       scheduler="sarathi_serve", chunk_size=chunk, max_batch_size=18)
    context = context_limit(sim, hf)
    on_gpu = plan_blocks(sim, hf, context, torch.float16, torch.device("cuda"), available=gpu.memory_bytes)
    assert on_gpu == sim_blocks(sim, hf, context)
    kv_bytes = 2 * 40 * 5120 * 2
    assert on_gpu * 16 * kv_bytes <= 0.9 * gpu.memory_bytes - Shape.of(hf).weight_bytes(2)


@pytest.mark.parametrize("memory_mib", [1024, 4096])
def test_the_engine_and_the_simulator_plan_one_kv_cache_on_one_cpus_memory(monkeypatch, memory_mib):
    # A CPU preallocates max_batch_size requests of the context, capped by a share of memory: 1 GiB
    # hits the cap, 4 GiB does not.
    import torch

    from sarathi_lab.model.memory import context_limit
    from sarathi_lab.sim import load_device

    ceilings = dataclasses.replace(load_device("a100"), name="cpu", memory_bytes=memory_mib * 2**20)
    monkeypatch.setattr("sarathi_lab.sim.device.cpu_device", lambda dtype="bfloat16": ceilings)
    real = EngineConfig(model="tiny", device="cpu", dtype="float32", max_batch_size=64)
    context, hf = context_limit(real, PRESETS["tiny"]), PRESETS["tiny"]
    on_cpu = plan_blocks(real, hf, context, torch.float32, torch.device("cpu"), available=ceilings.memory_bytes)
    assert on_cpu == sim_blocks(dataclasses.replace(real, executor="sim", sim_device="cpu"), hf, context)
    assert (on_cpu < 64 * context // 16) == (memory_mib == 1024)


def test_weights_that_leave_a_cpu_no_block_are_refused_by_the_engine_and_the_simulator(monkeypatch):
    # The CPU's cap (a share of memory) never counted the weights: a model larger than a simulated
    # CPU ran, and the real engine's cache could take a quarter of memory beside weights at nine tenths.
    import torch

    from sarathi_lab.model.memory import context_limit, resident_weight_bytes
    from sarathi_lab.sim import load_device

    real = EngineConfig(model="tiny", device="cpu", dtype="float32", max_batch_size=64)
    hf = PRESETS["tiny"]
    context = context_limit(real, hf)
    weights = resident_weight_bytes(real, Shape.of(hf), context, torch.float32, "cpu")
    block = Shape.of(hf).kv_bytes_per_token(4) * 16
    # Room for three blocks beside the weights: the cap is the room, not a quarter of memory.
    memory = weights + 3 * block
    assert plan_blocks(real, hf, context, torch.float32, torch.device("cpu"), available=memory) == 3
    ceilings = dataclasses.replace(load_device("a100"), name="cpu", memory_bytes=weights // 2)
    monkeypatch.setattr("sarathi_lab.sim.device.cpu_device", lambda dtype="bfloat16": ceilings)
    with pytest.raises(ConfigError, match=r"^sim_device='cpu' is invalid for this model: its weights take"):
        sim_blocks(dataclasses.replace(real, executor="sim", sim_device="cpu"), hf, context)


def test_an_iteration_that_leaves_a_gpu_less_than_a_block_is_refused_alike():
    # Room for one token's KV but not a block's gave the simulator 0 blocks and no error.
    import torch

    from sarathi_lab.model.memory import context_limit, resident_weight_bytes
    from sarathi_lab.sim import load_device

    hf = PRESETS["llama2-7b"]
    # The engine's planner reads no executor: one config, whatever this CPU runs (see above).
    cfg = EngineConfig(model="llama2-7b", executor="sim", sim_device="h100", dtype="float16", chunk_size=512,
                       max_batch_size=8)
    shape, context = Shape.of(hf), context_limit(cfg, hf)
    weights = resident_weight_bytes(cfg, shape, context, torch.float16, "cuda")
    used = weights + (cfg.chunk_size + cfg.max_batch_size) * shape.activation_bytes_per_token(2)  # sarathi's
    memory = int((used + shape.kv_bytes_per_token(2) * 8) / 0.9) + 1  # half a block of room
    gpu = dataclasses.replace(load_device("h100"), memory_bytes=memory)
    line = r"^chunk_size=512 is invalid on .*: an iteration of this many tokens and a decode per running request"
    with pytest.raises(ConfigError, match=line):
        plan_blocks(cfg, hf, context, torch.float16, torch.device("cuda"), available=memory)
    from unittest import mock

    with mock.patch("sarathi_lab.sim.build.load_device", lambda name, dtype=None: gpu), \
            pytest.raises(ConfigError, match=line):
        sim_blocks(cfg, hf, context)


@pytest.mark.parametrize("kv_cache_gb", [4.0, 60.0])
def test_an_explicit_kv_cache_is_kept_or_refused_alike_by_the_engine_and_the_simulator(kv_cache_gb):
    # 4 GB fits an H100 beside LLaMA-13B's 26 GB of weights; 60 GB does not.
    import torch

    from sarathi_lab.model.memory import context_limit
    from sarathi_lab.sim import load_device

    gpu, hf = load_device("h100"), PRESETS["llama-13b"]
    # The engine's planner reads no executor: one config, whatever this CPU runs (see above).
    sim = EngineConfig(model="llama-13b", executor="sim", sim_device="h100", dtype="float16", kv_cache_gb=kv_cache_gb)
    context = context_limit(sim, hf)
    if kv_cache_gb == 4.0:
        blocks = plan_blocks(sim, hf, context, torch.float16, torch.device("cuda"), available=gpu.memory_bytes)
        assert blocks == sim_blocks(sim, hf, context) == (4 * 2**30 // (2 * 40 * 5120 * 2 * 16))
        return
    line = rf"^kv_cache_gb={kv_cache_gb} is invalid: \d+ blocks of \d+ bytes take [\d.]+ GiB, more than the"
    with pytest.raises(ConfigError, match=line):
        plan_blocks(sim, hf, context, torch.float16, torch.device("cuda"), available=gpu.memory_bytes)
    with pytest.raises(ConfigError, match=line):
        sim_blocks(sim, hf, context)
