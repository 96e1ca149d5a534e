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
