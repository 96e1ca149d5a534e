"""A sweep job's folder name (hydra.sweep.subdir), `0_chunk=256,scheduler=vllm`: unsafe characters
become `_`; past MAX_NAME_CHARS it is cut and given a hash of the whole: long names stay apart."""
from __future__ import annotations

import hashlib
import re

from omegaconf import OmegaConf

RESOLVER = "sarathi_job_dir"
MAX_NAME_CHARS = 96
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def job_dir_name(num: int | str, overrides: str) -> str:
    """``overrides``: Hydra's hydra.job.override_dirname (key=value pairs joined by commas)."""
    name = f"{num}_{_UNSAFE.sub('_', overrides)}" if overrides else str(num)
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:MAX_NAME_CHARS - len(digest) - 1]}-{digest}"


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, job_dir_name)
