"""Where the engine's measured tables lie, as paths alone: found without loading a cost model."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import REPO_ROOT

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

# Here, where both measure/profiling/ops.py and the profile cost model read them.
OPS = ("qkv_proj", "attention", "o_proj", "ffn", "others")
# The GPU lease whose profiles every reader takes (docs/gpu/leases.md), not the newest.
LEASE_ENV = "SARATHI_PROFILE_LEASE"


def profiles_dir() -> Path:
    return Path(os.environ.get("SARATHI_PROFILES_DIR") or REPO_ROOT / "profiles")


def _name(model: str | ModelConfig) -> str:
    if not isinstance(model, str):
        raise TypeError("cost_model='profile' with a model config needs profile=<path to the CSV>")
    return Path(model).name if os.sep in model or Path(model).is_dir() else model


def own_profile_path(device: str, model: str | ModelConfig) -> Path:
    """Named by the preset, or by a Hugging Face directory's own name."""
    return profiles_dir() / device / f"{_name(model)}.csv"


def profile_path(device: str, model: str | ModelConfig) -> Path:
    """The lease LEASE_ENV names, else this machine's, else the newest lease's; else own path."""
    own = own_profile_path(device, model)
    if lease := os.environ.get(LEASE_ENV):
        return own.parent / lease / own.name
    if own.is_file():
        return own
    leased = sorted(own.parent.glob(f"*/{own.name}"))
    return leased[-1] if leased else own


def profiled_devices() -> list[tuple[str, str]]:
    tables = [*profiles_dir().glob("*/*.csv"), *profiles_dir().glob("*/*/*.csv")]
    return sorted({(p.relative_to(profiles_dir()).parts[0], p.stem) for p in tables})


def profile_description(path: str | Path) -> dict:
    """{} where nothing was written beside the table."""
    description = Path(path).with_suffix(".json")
    return json.loads(description.read_text()) if description.is_file() else {}
