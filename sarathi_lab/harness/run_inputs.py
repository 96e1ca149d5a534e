"""What decides a run besides its config (a trace's hash, a checkpoint), compared before reuse."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sarathi_lab.config import ConfigError
from sarathi_lab.harness.schema import RunConfig, WorkloadCfg
from sarathi_lab.harness.workloads import resolve_trace_path

TRACE_KINDS = ("trace", "trace_lengths")
CHUNK_BYTES = 1 << 20


def run_inputs(cfg: RunConfig) -> dict[str, Any]:
    """A relative model.path names another checkpoint from another directory: resolved."""
    found = trace_inputs(cfg.workload)
    if cfg.model.name == "hf" and cfg.model.path:
        found["model.path_resolved"] = str(Path(cfg.model.path).expanduser().resolve())
    return found


def trace_inputs(workload: WorkloadCfg) -> dict[str, Any]:
    """{} for an unreadable trace too: the run's own checks refuse it, naming why."""

    if workload.kind not in TRACE_KINDS or not workload.path:
        return {}
    try:
        path = resolve_trace_path(workload.path).resolve()
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                digest.update(chunk)
    except (ConfigError, OSError):
        return {}
    return {"workload.path_resolved": str(path), "workload.sha256": digest.hexdigest()}
