"""What decides a run's result besides its config: the file a trace workload reads, by the absolute
path it resolved to and a hash of its content, and a model=hf checkpoint's absolute folder. Recorded
in metrics.json (``inputs``) and compared before ``on_existing=skip`` (or a resumed sweep) keeps a
finished run, so that the run of another file for the same relative ``workload.path`` (from another
directory), or of a trace since edited, is never kept as this one."""
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
    """What ``cfg``'s run reads besides its config: a trace's (trace_inputs) and the absolute folder of
    a model=hf checkpoint (a relative model.path names another one from another directory)."""
    found = trace_inputs(cfg.workload)
    if cfg.model.name == "hf" and cfg.model.path:
        found["model.path_resolved"] = str(Path(cfg.model.path).expanduser().resolve())
    return found


def trace_inputs(workload: WorkloadCfg) -> dict[str, Any]:
    """{'workload.path_resolved': ..., 'workload.sha256': ...} for a trace workload; {} for the others,
    and for a trace that cannot be read (the run's own checks refuse it, naming why)."""
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
