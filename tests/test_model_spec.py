"""A preset as plain data (model.spec) against the transformers config the engine builds from it:
every fact the simulator and the memory plan read is the same on both, and transformers' own model
built from it has the parameters model.shape counts on the spec."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from sarathi_lab.config import EngineConfig
from sarathi_lab.model import PRESETS, load_config
from sarathi_lab.model.memory import context_limit
from sarathi_lab.model.presets import SPECS
from sarathi_lab.model.shape import Shape
from sarathi_lab.model.spec import ModelSpec, hf_config
from sarathi_lab.sim.sharding import Parallelism, shard_config


@pytest.mark.parametrize("name", list(SPECS))
def test_a_preset_reads_the_same_as_its_transformers_config(name):
    spec, hf = load_config(name), PRESETS[name]
    assert isinstance(spec, ModelSpec) and isinstance(hf, PretrainedConfig)
    # transformers 5 keeps rope's theta in rope_parameters, 4.x as rope_theta.
    theta = getattr(hf, "rope_theta", None) or hf.rope_parameters["rope_theta"]
    for field in dataclasses.fields(ModelSpec):
        # LLaMA's transformers config has no window at all; the spec says none (None).
        expected = theta if field.name == "rope_theta" else getattr(hf, field.name, None)
        assert getattr(spec, field.name) == expected, field.name
    assert spec.architectures == hf.architectures
    assert Shape.of(spec) == Shape.of(hf)
    assert context_limit(EngineConfig(model=name), spec) == context_limit(EngineConfig(model=name), hf)


def test_transformers_model_of_a_spec_has_the_parameters_shape_counts():
    spec = copy.deepcopy(SPECS["cpu-small"])  # tied embeddings
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(spec))
    assert Shape.of(spec).num_parameters == sum(p.numel() for p in model.parameters())


def test_a_spec_shards_as_a_transformers_config_does():
    par = Parallelism(tp=2, pp=2)
    spec, hf = shard_config(SPECS["yi-34b"], par), shard_config(PRESETS["yi-34b"], par)
    assert Shape.of(spec) == Shape.of(hf)
    assert SPECS["yi-34b"].num_attention_heads == 56  # the preset itself is left as it was


def test_hf_config_passes_a_transformers_config_through_and_presets_are_made_once():
    assert hf_config(PRESETS["tiny"]) is PRESETS["tiny"]
    assert "tiny" in PRESETS and "no-such-model" not in PRESETS and set(PRESETS) == set(SPECS)
