"""A model's config, checked buildable before any allocation, and its weight files."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import SETTING, ConfigError
from sarathi_lab.executors import stand_in_refusal
from sarathi_lab.model.presets import SIMULATED_ONLY, SPECS

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

# Each with whether its attention projections carry a bias.
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": False, "MistralForCausalLM": False,
                           "Qwen2ForCausalLM": True}


class ModelLoadError(ConfigError):
    """A bad model key, refused in one line."""


def eos_token_of(config: ModelConfig) -> int | None:
    eos = getattr(config, "eos_token_id", None)
    return eos[0] if isinstance(eos, list) else eos


def check_buildable(model: str, executor: str) -> None:
    """A simulator-only preset refused off the simulator: its stand-in is not the model."""
    if (why := stand_in_refusal(executor, model, SIMULATED_ONLY.get(model))) is not None:
        raise ModelLoadError(why)


def load_config(model: str) -> ModelConfig:
    """A preset needs no transformers import; a directory never runs remote code."""
    if model in SPECS:
        return SPECS[model]
    path, at = Path(model), SETTING.set("model", model)
    if not path.is_dir():
        raise ModelLoadError(f"{at} is invalid: it is neither a preset ({', '.join(SPECS)}) nor a "
                             "local directory (a Hugging Face model's config.json and "
                             "*.safetensors)")
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
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                 "vocab_size", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelLoadError(f"{at}: config.json's {name}={value!r} is invalid: must be an int "
                                 f">= 1")
    # Every weight file's header readable before any allocation (tensors are checked as they load).
    for file in weight_files(path):
        if not file.is_file():
            raise ModelLoadError(f"{SETTING.set('model', str(path))}: the index names {file.name}, "
                                 f"which is missing")
        with open_weights(path, file):
            pass
    return config


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        found = (f"found only pickle checkpoints ({', '.join(pickles)}), which are refused"
                 if pickles else "none found")
        raise ModelLoadError(f"{SETTING.set('model', str(path))}: weights must be *.safetensors; "
                             f"{found}")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{SETTING.set('model', str(path))}: {index.name} is not a valid "
                                 f"index ({first_line(e)})") from None
        files = [path / s for s in shards]
    return files


def open_weights(path: Path, file: Path):
    from safetensors import safe_open

    try:
        return safe_open(file, framework="pt")
    except Exception as e:  # noqa: BLE001 - safetensors' own error types
        raise ModelLoadError(f"{SETTING.set('model', str(path))}: {file.name} is not a readable "
                             f"safetensors file ({first_line(e)})") from None
