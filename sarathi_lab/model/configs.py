"""A model's Hugging Face config, from a preset or a local directory, checked to be buildable before
anything is allocated, and what a directory's weights are: what a run reads of a model without
building it (the simulator never does)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import SETTING, ConfigError
from sarathi_lab.executors import executor_class, executors_with
from sarathi_lab.model.presets import SIMULATED_ONLY, SPECS

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

# The architectures the decoder builds, each with whether its attention projections carry a bias.
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": False, "MistralForCausalLM": False, "Qwen2ForCausalLM": True}


class ModelLoadError(ConfigError):
    """A model directory that cannot be built from: a bad value of the model key, refused in one line."""


def eos_token_of(config: ModelConfig) -> int | None:
    """The token that ends a request (the first, where a config lists several)."""
    eos = getattr(config, "eos_token_id", None)
    return eos[0] if isinstance(eos, list) else eos


def check_buildable(model: str, executor: str) -> None:
    """Refuses, in one line naming the model, a simulator-only preset anywhere but on the simulator:
    the engine would otherwise build its LLaMA-form stand-in as if it were the model."""
    if model in SIMULATED_ONLY and not executor_class(executor).simulated:
        simulators = ", ".join(executors_with("simulated"))
        raise ModelLoadError(f"{SETTING.set('model', model)} is invalid with {SETTING.set('executor', executor)}: "
                             f"{SIMULATED_ONLY[model]}; allowed: {SETTING('executor')}={simulators}")


def load_config(model: str) -> ModelConfig:
    """A preset's spec (plain data: no transformers import), or the config of a local Hugging Face
    directory (never remote code), with its shapes checked: what the model would be built from is
    known to be buildable."""
    if model in SPECS:
        return SPECS[model]
    path, at = Path(model), SETTING.set("model", model)
    if not path.is_dir():
        raise ModelLoadError(f"{at} is invalid: it is neither a preset ({', '.join(SPECS)}) nor a local "
                             "directory (a Hugging Face model's config.json and *.safetensors)")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{at}: no config.json in the directory")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelLoadError(f"{at}: config.json is not valid JSON ({first_line(e)})") from None
    from transformers import AutoConfig  # with its model registry: only a directory needs it

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{at}: config.json cannot be read: {first_line(e)}") from None
    arch = (config.architectures or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{at}: architecture {arch} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelLoadError(f"{at}: config.json's {name}={value!r} is invalid: must be an int >= 1")
    # Every weight file's header readable before any weight is allocated (tensors are checked as they load).
    for file in weight_files(path):
        if not file.is_file():
            raise ModelLoadError(f"{SETTING.set('model', str(path))}: the index names {file.name}, which is missing")
        with open_weights(path, file):
            pass
    return config


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        found = f"found only pickle checkpoints ({', '.join(pickles)}), which are refused" if pickles else "none found"
        raise ModelLoadError(f"{SETTING.set('model', str(path))}: weights must be *.safetensors; {found}")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{SETTING.set('model', str(path))}: {index.name} is not a valid index "
                                 f"({first_line(e)})") from None
        files = [path / s for s in shards]
    return files


def open_weights(path: Path, file: Path):
    from safetensors import safe_open

    try:
        return safe_open(file, framework="pt")
    except Exception as e:  # noqa: BLE001 - safetensors' own error types
        raise ModelLoadError(f"{SETTING.set('model', str(path))}: {file.name} is not a readable safetensors file "
                             f"({first_line(e)})") from None
