"""sarathi_lab: chunked prefill on a paged-KV engine; names load lazily (no torch for --help)."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "LLM": "sarathi_lab.llm",
    "ConfigError": "sarathi_lab.config",
    "EngineConfig": "sarathi_lab.config",
    "IterationRecord": "sarathi_lab.engine.metrics",
    "Metrics": "sarathi_lab.engine.metrics",
    "RequestRecord": "sarathi_lab.engine.metrics",
    "SLO": "sarathi_lab.engine.metrics",
    "SamplingParams": "sarathi_lab.engine.sequence",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'sarathi_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
