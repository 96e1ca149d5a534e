"""The configs a user with several GPUs runs: the papers' multi-GPU models as presets of their real
shapes (against the published configs), how LLaMA2-70B splits over 2 / 4 / 8 ranks without processes,
the simulator-only Falcon-180B refused by the real engine, the capacity overlays composing to the
configs recorded in tests/data/experiment_scales_golden.json (``multi_gpu``), the per-rank memory plan
of pipeline stages, the driver's broadcast in a run's metrics, and (slow) each overlay's CPU dry run at
tiny shapes with the same ranks: TP2 spawned, TP4 as two torchrun nodes of two ranks on one machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.metrics import IterationRecord, Metrics
from sarathi_lab.harness import scales
from sarathi_lab.harness.cli_check import compose_config
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.host_features import usable_cores
from sarathi_lab.model.configs import ModelLoadError
from sarathi_lab.model.parallel.group import free_port
from sarathi_lab.model.parallel.sharding import TensorShards, rank_memory_config
from sarathi_lab.model.presets import PRESETS
from sarathi_lab.model.shape import Shape
from sarathi_lab.plan import plan_engine

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "data" / "experiment_scales_golden.json").read_text())["multi_gpu"]
# Each multi-GPU capacity overlay, its ranks, and how its CPU dry run is started.
OVERLAYS = {"capacity_yi34b_tp2": 2, "capacity_llama2_70b_tp4": 4}
GB = 1e9


def first_job(overlay: str) -> list[str]:
    """``experiment=<overlay>`` and its sweep's first values: the job ``-m`` runs first."""
    params = compose_config([f"experiment={overlay}"], hydra=True).hydra.sweeper.params or {}
    return [f"experiment={overlay}"] + [f"{k}={str(v).split(',')[0]}" for k, v in params.items()]


def resolved(overlay: str) -> dict:
    return OmegaConf.to_container(compose_config(first_job(overlay)), resolve=True)


def as_recorded(config, recorded):
    """``config`` cut to the keys the recorded one has: a key added since (a new engine knob at its
    default) is tested where it was added; a recorded key missing or changed still fails."""
    if isinstance(config, dict) and isinstance(recorded, dict):
        return {k: as_recorded(config[k], recorded[k]) if k in config else "<missing>" for k in recorded}
    return config


def test_the_papers_multi_gpu_models_have_their_published_shapes():
    # meta-llama/Llama-2-70b-hf's config.json.
    llama = PRESETS["llama2-70b"]
    assert (llama.num_hidden_layers, llama.hidden_size, llama.num_attention_heads, llama.num_key_value_heads,
            llama.intermediate_size, llama.vocab_size, llama.max_position_embeddings) == \
        (80, 8192, 64, 8, 28672, 32000, 4096)
    assert llama.rope_parameters["rope_theta"] == 10000.0
    assert 68e9 < Shape.of(llama).weight_bytes(1) < 70e9  # ~69B parameters
    # tiiuae/falcon-180B's: its 2 x h x 4h MLP weights as a gated MLP's 3 x h x I, within 0.01%.
    falcon = PRESETS["falcon-180b"]
    h = falcon.hidden_size
    assert (falcon.num_hidden_layers, h, falcon.num_attention_heads, falcon.num_key_value_heads,
            h // falcon.num_attention_heads, falcon.vocab_size, falcon.max_position_embeddings) == \
        (80, 14848, 232, 8, 64, 65024, 2048)
    assert abs(3 * falcon.intermediate_size - 2 * 4 * h) / (8 * h) < 1e-4


@pytest.mark.parametrize("size", [2, 4, 8])
def test_llama2_70b_splits_over_its_ranks_by_heads_kv_heads_and_columns(size):
    config = PRESETS["llama2-70b"]
    shards = [TensorShards.of(config, r, size, "llama2-70b") for r in range(size)]
    assert {(s.local_heads, s.local_kv_heads) for s in shards} == {(64 // size, 8 // size)}
    # Every query head's KV head is on its rank: GQA's 8 query heads a KV head never straddle ranks.
    for s in shards:
        assert s.first_kv_head == s.first_head // 8
    whole, rank = Shape.of(config), Shape.of(rank_memory_config(config, size, "llama2-70b"))
    assert rank.kv_bytes_per_token(2) * size == whole.kv_bytes_per_token(2)
    # The layers' weights split N ways; the embedding and the LM head (2 x 32000 x 8192) count whole.
    layers = whole.weight_bytes(2) - 2 * 32000 * 8192 * 2
    assert rank.weight_bytes(2) == pytest.approx(layers / size + 2 * 32000 * 8192 * 2, rel=1e-3)
    assert rank.weight_bytes(2) < {2: 70, 4: 36, 8: 19}[size] * GB  # ~35 GB a rank at TP4: fits 80 GB GPUs


@pytest.mark.parametrize(("size", "names"), [(3, "64 attention heads"), (128, "64 attention heads"),
                                              (5, "64 attention heads")])
def test_a_split_llama2_70b_cannot_take_is_refused_in_one_line(size, names):
    with pytest.raises(ConfigError) as e:
        TensorShards.of(PRESETS["llama2-70b"], 0, size, "llama2-70b")
    message = str(e.value)
    assert message.startswith(f"tensor_parallel={size} is invalid for model='llama2-70b'") and names in message


@pytest.mark.parametrize("executor", ["model", "vllm"])
def test_the_real_engine_refuses_the_simulator_only_falcon_in_one_line(executor):
    with pytest.raises(ModelLoadError) as e:
        plan_engine(EngineConfig(model="falcon-180b", device="cpu", dtype="float32", executor=executor,
                                 scheduler="sarathi_serve"))
    message = str(e.value)
    assert message.startswith(f"model='falcon-180b' is invalid with executor='{executor}': Falcon's decoder")
    assert message.endswith("allowed: executor=sim") and "\n" not in message


def test_the_simulator_holds_falcon_on_eight_a100s_not_on_four():
    # 359 GB of bfloat16 weights: a quarter (90 GB) is more than an A100's 80 GB, an eighth fits, which
    # is why Sarathi-Serve adds a pipeline stage on a second node.
    eight = plan_engine(EngineConfig(model="falcon-180b", executor="sim", sim_device="a100", sim_tp=8))
    assert eight.kv_capacity_tokens > 100_000
    with pytest.raises(ConfigError, match=r"^sim_device='a100' is invalid for this model: its weights take 83.6 GiB"):
        plan_engine(EngineConfig(model="falcon-180b", executor="sim", sim_device="a100", sim_tp=4))


@pytest.mark.parametrize("overlay", [*OVERLAYS, *(f"dry/{o}" for o in OVERLAYS)])
def test_each_multi_gpu_overlay_composes_to_its_recorded_config(overlay):
    assert first_job(overlay) == GOLDEN[overlay]["argv"]
    assert as_recorded(resolved(overlay), GOLDEN[overlay]["first_job"]) == GOLDEN[overlay]["first_job"]


@pytest.mark.parametrize(("overlay", "ranks"), OVERLAYS.items())
def test_the_gpu_overlay_is_the_paper_s_model_on_n_gpus_and_its_dry_run_the_tiny_one_on_as_many_ranks(overlay, ranks,
                                                                                                     monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: ranks)  # a core a rank, as the dry run needs
    gpu = resolved(overlay)
    assert (gpu["engine"]["tensor_parallel"], gpu["device"]["name"], gpu["engine"]["executor"], gpu["task"]) == \
        (ranks, "cuda", "model", "capacity")
    dry = parse_config(compose_config(first_job(f"dry/{overlay}")))
    assert (dry.model.name, dry.engine.tensor_parallel, dry.engine.executor, dry.dtype) == \
        ("tiny", ranks, "model", "float32")
    assert dict(o.split("=", 1) for o in scales.overrides(overlay, "dry"))["scheduler"] == "sarathi_serve"


def test_llama2_70b_s_overlay_is_simulated_on_four_a100s_as_its_header_says():
    run = parse_config(compose_config([*first_job("capacity_llama2_70b_tp4"), "executor=sim", "engine.sim_tp=4",
                                       "engine.tensor_parallel=1", "device=auto"]))
    plan = plan_engine(run.engine)
    assert plan.config.sim_tp == 4 and plan.kv_capacity_tokens > 100_000


def test_each_pipeline_stage_plans_for_its_own_layers(monkeypatch):
    monkeypatch.setattr("sarathi_lab.plan.usable_cores", lambda: 4)
    settings = {"model": "tiny", "device": "cpu", "dtype": "float32", "kv_cache_gb": 0.01}
    one = plan_engine(EngineConfig(**settings)).num_kv_blocks
    # tiny's 4 layers: 2 a stage, so the same budget holds twice the blocks; with 2 ranks a stage, 4 times.
    assert plan_engine(EngineConfig(**settings, pipeline_parallel=2)).num_kv_blocks in (2 * one, 2 * one + 1)
    assert plan_engine(EngineConfig(**settings, tensor_parallel=2, pipeline_parallel=2)).num_kv_blocks in \
        range(4 * one, 4 * one + 4)


def _iteration(i: int, duration: float) -> IterationRecord:
    return IterationRecord(i, float(i), duration, 0, 4, 0, 4, 0, 0, 0.0, 0.0, duration, 0.0)


def test_a_run_s_metrics_report_its_driver_s_broadcast_per_iteration():
    metrics = Metrics(iterations=[_iteration(i, 0.1) for i in range(3)])
    assert not any(k.startswith("broadcast") for k in metrics.summary())  # one device: nothing to report
    # The executor's lifetime of sends: the warm-up's and an earlier call's first, this call's last.
    metrics.keep_broadcasts([9.0, 9.0, 0.001, 0.002, 0.003], [1, 1, 100, 200, 300])
    summary = metrics.summary()
    assert summary["broadcast_p50_ms"] == pytest.approx(2.0) and summary["broadcast_p99_ms"] < 3.0
    assert summary["broadcast_p50_bytes"] == 200 and summary["broadcast_fraction"] == pytest.approx(0.006 / 0.3)


def _trial_metrics(sweep: Path) -> dict:
    found = sorted(sweep.glob("*/trial-0-*/metrics.json"))
    assert found, sorted(str(p) for p in sweep.rglob("*"))[:20]
    return json.loads(found[0].read_text())


ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels")]), "GLOO_SOCKET_IFNAME": "lo",
       "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _check_dry_run(sweep: Path, ranks: int) -> None:
    record = _trial_metrics(sweep)
    assert record["environment"]["tensor_parallel"] == ranks
    assert record["summary"]["broadcast_p50_ms"] > 0 and record["summary"]["broadcast_p50_bytes"] > 80
    assert json.loads(next(sweep.glob("*/capacity.json")).read_text())["trials"]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two cores")
def test_the_two_gpu_overlay_s_dry_run_serves_a_capacity_trial_on_two_cpu_ranks(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sarathi_lab.run", "-m", "experiment=dry/capacity_yi34b_tp2",
                           f"hydra.sweep.dir={tmp_path}"], check=False, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_dry_run(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(usable_cores() < 2, reason="two ranks a node need two cores")
def test_the_four_gpu_overlay_s_dry_run_serves_a_capacity_trial_on_two_torchrun_nodes_of_two_ranks(tmp_path):
    # A node's ranks are what a node's cores are checked against: two nodes of two ranks on this machine,
    # as two GPU nodes of two would run it (docs/parallel.md).
    port, sweep = str(free_port()), tmp_path / "sweep"
    logs = [tmp_path / f"node{n}.log" for n in (0, 1)]  # files, not pipes: a full pipe would stall its node
    nodes = []
    try:
        for n in (1, 0):
            with logs[n].open("w") as log:
                nodes.append(subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(n),
                     "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", port, "-m",
                     "sarathi_lab.run", "-m", "experiment=dry/capacity_llama2_70b_tp4", f"hydra.sweep.dir={sweep}"],
                    env=ENV, stdout=log, stderr=subprocess.STDOUT))
        codes = [node.wait(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert codes == [0, 0], logs[0].read_text()[-3000:] + logs[1].read_text()[-1500:]
    _check_dry_run(sweep, 4)
