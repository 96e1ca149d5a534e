"""sarathi_lab: measure chunked prefill (SARATHI, Sarathi-Serve) on a real paged-KV engine."""
import importlib

# The public names load on first use, so that `import sarathi_lab` and the CLI's --help stay fast
# (the engine pulls in torch and transformers).
_PUBLIC = {"LLM": "sarathi_lab.llm", "ConfigError": "sarathi_lab.config", "EngineConfig": "sarathi_lab.config",
           "IterationRecord": "sarathi_lab.engine.metrics", "Metrics": "sarathi_lab.engine.metrics",
           "RequestRecord": "sarathi_lab.engine.metrics", "SamplingParams": "sarathi_lab.engine.sequence"}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'sarathi_lab' has no attribute {name!r}")
    if name == "LLM":
        import os

        import torch

        # Without a GPU the Triton kernels run in Triton's interpreter, which must be chosen before
        # anything imports triton (transformers does, below).
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
