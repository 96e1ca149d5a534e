"""The shape arithmetic against what transformers builds from the same config."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from sarathi_lab.model import PRESETS
from sarathi_lab.model.shape import Shape, iteration_cost


@pytest.mark.parametrize("tied", [False, True])
def test_parameters_and_kv_bytes_match_transformers_model(tied):
    config = copy.deepcopy(PRESETS["tiny"])
    config.tie_word_embeddings = tied
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Tied embeddings are one tensor: parameters() yields it once.
    assert Shape.of(config).num_parameters == sum(p.numel() for p in model.parameters())
    layer = model.model.layers[0].self_attn
    kv_elems = layer.k_proj.out_features + layer.v_proj.out_features
    assert Shape.of(config).kv_bytes_per_token(2) == kv_elems * config.num_hidden_layers * 2


def test_iteration_cost_counts_one_decode_of_one_token():
    s = Shape.of(PRESETS["tiny"])
    flops, nbytes = iteration_cost(s, [1], [1], 1, 2)
    linear = 2 * s.layer_linear_params * s.layers
    assert flops == linear + 4 * s.heads * s.head_dim * s.layers + 2 * s.hidden * s.vocab
    assert nbytes == ((s.layer_linear_params * s.layers + s.hidden * s.vocab + s.hidden) * 2
                      + 2 * s.kv_bytes_per_token(2))


def test_a_plain_mlp_counts_one_up_projection_as_transformers_builds_phi():
    # phi-2's MLP (fc1, GELU, fc2) has no gate: its layer holds 2 x hidden x intermediate MLP weights,
    # and the simulator's roofline costs the projections that layer has, not a gated layer's.
    from transformers import PhiConfig, PhiForCausalLM

    from sarathi_lab.sim.device import load_device
    from sarathi_lab.sim.roofline import RooflineCostModel

    config = PhiConfig(vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                       num_attention_heads=8)
    with torch.device("meta"):
        model = PhiForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    shape = Shape.of(config)
    assert not shape.gated and shape.layer_linear_params == linear
    assert shape.gemms["gate_up_proj"] == (256, 1024)
    # The roofline costs exactly these GEMMs: one up projection of 256 x 1024, no gate beside it.
    roofline = RooflineCostModel(load_device("a100"), config)
    ops = roofline.iteration_cost([(64, 64)]).ops
    layers = config.num_hidden_layers
    assert ops["gate_up_proj"] == layers * roofline.gemm_s(64, 256, 1024)
    assert {k: v for k, v in ops.items() if k.endswith("_proj")} == {
        name: layers * roofline.gemm_s(64, k, n) for name, (k, n) in shape.gemms.items()}


def test_whether_an_mlp_is_gated_follows_the_model_type_not_only_the_activation():
    # GPT-NeoX's plain MLP uses "gelu", Gemma's gated one a GELU too: the activation alone misleads.
    from transformers import GemmaConfig, GPTNeoXConfig

    from sarathi_lab.model.shape import is_gated

    assert not is_gated(GPTNeoXConfig()) and is_gated(GemmaConfig()) and is_gated(PRESETS["llama2-7b"])
