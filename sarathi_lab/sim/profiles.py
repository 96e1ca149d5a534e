"""Where the engine's measured tables lie (``task=profile`` writes them; GPU leases bring theirs into
dated folders) and what was written beside each: paths alone, so that choosing a cost model, the
benches and the profile task find the same table without loading any cost model."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import REPO_ROOT

if TYPE_CHECKING:
    from sarathi_lab.model.spec import ModelConfig

# The ops a profile times, split as the paper's Fig. 3 and 7 split a forward (profiling/ops.py
# measures them, the profile cost model sums them): here, where both read them.
OPS = ("qkv_proj", "attention", "o_proj", "ffn", "others")
# Names the GPU lease whose profiles every reader takes (docs/gpu/leases.md), instead of the newest.
LEASE_ENV = "SARATHI_PROFILE_LEASE"


def profiles_dir() -> Path:
    return Path(os.environ.get("SARATHI_PROFILES_DIR") or REPO_ROOT / "profiles")


def _name(model: str | ModelConfig) -> str:
    if not isinstance(model, str):
        raise TypeError("cost_model='profile' with a model config needs profile=<path to the CSV>")
    return Path(model).name if os.sep in model or Path(model).is_dir() else model


def own_profile_path(device: str, model: str | ModelConfig) -> Path:
    """Where task=profile writes ``model``'s table on ``device``: ``profiles/<device>/<name>.csv``, named by
    the preset, or by a Hugging Face directory's own name."""
    return profiles_dir() / device / f"{_name(model)}.csv"


def profile_path(device: str, model: str | ModelConfig) -> Path:
    """The table of ``model`` on ``device`` every reader takes: the lease LEASE_ENV names
    (``profiles/<device>/<lease>/``, whether or not it holds one), else the one task=profile measured
    here (``own_profile_path``), else the newest GPU lease's that holds one (gpu/collect.py keeps each
    lease's in its own folder, ``<date>_<commit>``: newest sorts last). Where none is, the own path."""
    own = own_profile_path(device, model)
    if lease := os.environ.get(LEASE_ENV):
        return own.parent / lease / own.name
    if own.is_file():
        return own
    leased = sorted(own.parent.glob(f"*/{own.name}"))
    return leased[-1] if leased else own


def profiled_devices() -> list[tuple[str, str]]:
    """(device, model) of every profile under profiles_dir(), measured here or in a lease."""
    tables = [*profiles_dir().glob("*/*.csv"), *profiles_dir().glob("*/*/*.csv")]
    return sorted({(p.relative_to(profiles_dir()).parts[0], p.stem) for p in tables})


def profile_description(path: str | Path) -> dict:
    """What task=profile wrote beside the table at ``path`` (machine, engine, clock, grids); {} where
    nothing was."""
    description = Path(path).with_suffix(".json")
    return json.loads(description.read_text()) if description.is_file() else {}
