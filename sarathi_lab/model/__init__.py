"""The model: configs import with it; decoder and builder on first use (never the simulator)."""
from __future__ import annotations

import importlib
from typing import Any

from sarathi_lab.model.configs import SUPPORTED_ARCHITECTURES, ModelLoadError, load_config
from sarathi_lab.model.presets import PRESETS

_ON_USE = {"CausalLM": "sarathi_lab.model.decoder", "build_model": "sarathi_lab.model.loader"}
__all__ = ["PRESETS", "SUPPORTED_ARCHITECTURES", "CausalLM", "ModelLoadError", "build_model",
           "load_config"]


def __getattr__(name: str) -> Any:
    if name not in _ON_USE:
        raise AttributeError(f"module 'sarathi_lab.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_ON_USE[name]), name)
    globals()[name] = value
    return value
