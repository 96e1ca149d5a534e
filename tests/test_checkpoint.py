"""save_checkpoint writes what the loader reads back, weight for weight, and what transformers loads
as the same model (the checkpoint executor=vllm hands to vLLM)."""
from __future__ import annotations

import copy

import pytest
import torch

from sarathi_lab.attention import make_backend
from sarathi_lab.model import PRESETS, build_model, load_config
from sarathi_lab.model.checkpoint import save_checkpoint


def _build(model, config, seed=3):
    return build_model(model, config, make_backend("torch", torch.device("cpu")), 64, torch.float32,
                       torch.device("cpu"), seed, "aten")


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_round_trips_through_the_loader(tmp_path, tied):
    config = copy.deepcopy(PRESETS["tiny"])
    config.tie_word_embeddings = tied
    lm = _build("tiny", config)
    save_checkpoint(lm, config, tmp_path)
    again = _build(str(tmp_path), load_config(str(tmp_path)), seed=99)  # another seed: loaded, not drawn
    ours, theirs = dict(lm.named_parameters()), dict(again.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, p in ours.items():
        assert torch.equal(p, theirs[name]), name


def test_transformers_loads_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM

    config = PRESETS["tiny"]
    lm = _build("tiny", config)
    save_checkpoint(lm, config, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    # Every weight of the reference found under its own name, equal to ours: nothing left at its init.
    state = hf.state_dict()
    embed = dict(lm.named_parameters())["embed_tokens.weight"]
    assert torch.equal(state["model.embed_tokens.weight"], embed)
    ours = dict(lm.named_parameters())
    _, k, v = ours["layers.1.self_attn.qkv_proj.weight"].split(
        [lm.layers[1].self_attn.q_size, lm.layers[1].self_attn.kv_size, lm.layers[1].self_attn.kv_size])
    assert torch.equal(state["model.layers.1.self_attn.k_proj.weight"], k)
    assert torch.equal(state["model.layers.1.self_attn.v_proj.weight"], v)
    assert torch.equal(state["lm_head.weight"], ours["lm_head.weight"])
