"""Bad input to the engine fails before any work with one clear line."""
from __future__ import annotations

import json

import pytest
import torch

from sarathi_lab import LLM, ConfigError
from sarathi_lab.model import ModelLoadError
from tests.hf_models import save_random_model


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", device="cpu", dtype="float32", warmup_iters=0, max_model_len=64)


@pytest.mark.parametrize("kwargs, message", [
    ({"scheduler": "fifo"}, "scheduler='fifo' is invalid: allowed values are"),
    ({"model": "gpt-17"}, "model='gpt-17' is invalid: it is neither a preset"),
    ({"device": "tpu"}, "device='tpu' is invalid"),
    ({"dtype": "int8"}, "dtype='int8' is invalid"),
    ({"chunk_size": 0}, "chunk_size=0 is invalid: must be > 0"),
    ({"chunk_size": 2.5}, "chunk_size=2.5 is invalid: must be of type int"),
    ({"max_batch_size": -1}, "max_batch_size=-1 is invalid"),
    ({"attention": "flash"}, "attention='flash' is invalid"),
    ({"max_model_len": 10**6}, "max_model_len=1000000 is invalid: the model allows at most 2048"),
])
def test_bad_config_is_one_clear_line(kwargs, message):
    with pytest.raises((ConfigError, ModelLoadError)) as err:
        LLM(**({"model": "tiny"} | kwargs), warmup_iters=0)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_refused():
    with pytest.raises(ConfigError, match="device='cuda' is invalid: no CUDA device"):
        LLM("tiny", device="cuda")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    save_random_model("llama", directory)
    return directory


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="neither a preset .* nor a local directory"):
        LLM(str(tmp_path / "nope"), warmup_iters=0)


def test_unsupported_architecture(saved, tmp_path):
    config = json.loads((saved / "config.json").read_text())
    config |= {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel is not supported; supported: LlamaForCausalLM"):
        LLM(str(tmp_path), warmup_iters=0)


def test_pickle_checkpoint_is_refused(saved, tmp_path):
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"pickle checkpoints \(pytorch_model.bin\), which are refused"):
        LLM(str(tmp_path), warmup_iters=0)


def _rewrite_weights(saved, tmp_path, edit):
    from safetensors.torch import load_file, save_file
    (tmp_path / "config.json").write_text((saved / "config.json").read_text())
    weights = load_file(saved / "model.safetensors")
    edit(weights)
    save_file(weights, tmp_path / "model.safetensors")


def test_missing_weight(saved, tmp_path):
    _rewrite_weights(saved, tmp_path, lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match="weights missing from the checkpoint: layers.1.mlp.gate_up_proj"):
        LLM(str(tmp_path), warmup_iters=0)


def test_wrong_shape(saved, tmp_path):
    def edit(w):
        w["model.layers.0.self_attn.k_proj.weight"] = w["model.layers.0.self_attn.k_proj.weight"][:-1]
    _rewrite_weights(saved, tmp_path, edit)
    with pytest.raises(ModelLoadError, match=r"k_proj.weight has shape \(31, 64\), expected \(32, 64\)"):
        LLM(str(tmp_path), warmup_iters=0)


def _model_dir(saved, tmp_path, config_edit=None, files=("model.safetensors",)):
    config = json.loads((saved / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config_edit(config) if config_edit else config))
    for name in files:
        (tmp_path / name).write_bytes((saved / "model.safetensors").read_bytes())
    return tmp_path


@pytest.mark.parametrize("case, message", [
    ("invalid_json", r"config.json is not valid JSON \(Expecting"),
    ("zero_layers", r"config.json's num_hidden_layers=0 is invalid: must be an int >= 1"),
    ("empty_safetensors", r"model.safetensors is not a readable safetensors file"),
    ("corrupt_safetensors", r"model.safetensors is not a readable safetensors file"),
    ("missing_shard", r"the index names model-00002-of-00002.safetensors, which is missing"),
    ("bad_index", r"model.safetensors.index.json is not a valid index"),
])
def test_a_broken_model_directory_is_one_line_before_any_weight_is_allocated(saved, tmp_path, case, message):
    from sarathi_lab.model import load_config
    path = _model_dir(saved, tmp_path, (lambda c: c | {"num_hidden_layers": 0}) if case == "zero_layers" else None)
    if case == "invalid_json":
        (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    elif case == "empty_safetensors":
        (path / "model.safetensors").write_bytes(b"")
    elif case == "corrupt_safetensors":
        (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    elif case == "missing_shard":
        (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    elif case == "bad_index":
        (path / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match=message) as err:
        load_config(str(path))
    assert "\n" not in str(err.value)
