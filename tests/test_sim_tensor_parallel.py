"""The simulator's tensor parallelism (engine.sim_tp): sim_tp GPUs of sim_device serving as one, as
Sarathi-Serve runs Yi-34B on two A100s. Checked against arithmetic done here, not the simulator's own."""
from __future__ import annotations

import pytest

from sarathi_lab import LLM
from sarathi_lab.config import ConfigError
from sarathi_lab.harness.budget import budget_cost_model
from sarathi_lab.harness.compose import compose_config
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.model import load_config
from sarathi_lab.sim import CostModel


def test_two_gpus_halve_a_compute_bound_prefill_and_pay_two_all_reduces_a_layer():
    one = CostModel.for_device("a100", "llama2-7b")
    two = CostModel.for_device("a100", "llama2-7b", tp=2)
    tokens = 4096  # compute-bound: every GEMM's flops split in two
    a, b = one.iteration_cost([(tokens, tokens)], [], 1), two.iteration_cost([(tokens, tokens)], [], 1)
    # NVLink 3 ring all-reduce of the 4096 x 4096 bf16 hidden states, 10 us to launch, 240 GB/s.
    allreduce = 2 * 32 * (10e-6 + 2 * (2 - 1) / 2 * tokens * 4096 * 2 / 240e9)
    assert b.ops["allreduce"] == pytest.approx(allreduce, rel=1e-12)
    assert b.forward_s - allreduce == pytest.approx(a.forward_s / 2, rel=0.02)
    assert b.prepare_s == a.prepare_s  # one host drives both


def test_each_gpu_holds_half_the_weights_and_half_of_every_token_s_kv():
    blocks = {tp: LLM("mistral-7b", executor="sim", sim_device="a100", sim_tp=tp, max_batch_size=128,
                      chunk_size=512).num_kv_blocks for tp in (1, 2)}
    # Mistral-7B's 8 KV heads split 4 + 4: a token takes half the bytes on each GPU, and each GPU's
    # weights are half as large, so more than twice the tokens fit.
    assert blocks[2] > 2 * blocks[1]


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "mistral-7b", "sim_tp": 3}, (r"^sim_tp=3 is invalid for model='mistral-7b': its 32 attention heads "
                                           r"do not split evenly across 3 ranks; allowed: a divisor of 32$")),
    ({"model": "tiny", "sim_tp": 2, "sim_cost_model": "profile"},
     (r"^sim_cost_model='profile' is invalid for this model on sim_device='a100' at sim_tp=2: its GPU kernels were "
      r"not measured \(measured: codellama-34b, .*\); use calibrated$")),
    ({"model": "tiny", "sim_tp": 0}, r"^sim_tp=0 is invalid: must be > 0$"),
])
def test_a_bad_tensor_parallel_degree_is_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LLM(executor="sim", sim_device="a100", **kwargs)


def test_a_cpu_profile_refuses_tensor_parallelism():
    with pytest.raises(ConfigError, match=r"^sim_tp=2 is invalid with sim_cost_model='profile' on sim_device='cpu': "
                                          r"a profile times one device; allowed: 1, or sim_cost_model=roofline$"):
        LLM("tiny", executor="sim", sim_device="cpu", sim_cost_model="profile", sim_tp=2)


def test_the_real_engine_refuses_tensor_parallelism():
    with pytest.raises(ConfigError, match=r"^sim_tp=2 is invalid with executor='model': the engine simulates no GPUs; "
                                          r"allowed: 1 \(or executor=sim\)$"):
        LLM("tiny", device="cpu", sim_tp=2)


def test_the_yi_34b_capacity_experiment_runs_two_a100s_and_its_budget_sees_both():
    cfg = parse_config(compose_config(["experiment=capacity_sim_yi34b", "scheduler=sarathi_serve"]))
    engine = cfg.engine
    assert (engine.model, engine.sim_device, engine.sim_tp, cfg.slo.tbt_p99_s) == ("yi-34b", "a100", 2, 0.2)
    yi = load_config("yi-34b")
    assert (yi.num_hidden_layers, yi.hidden_size, yi.num_attention_heads, yi.num_key_value_heads) == (60, 7168, 56, 8)
    model, described = budget_cost_model(engine)
    assert described == "roofline a100 x2 (tensor parallel)"
    assert model.iteration_cost([(512, 512)], [2048] * 8).ops["allreduce"] > 0
