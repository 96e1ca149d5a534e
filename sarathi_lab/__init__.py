"""sarathi_lab: measure chunked prefill (SARATHI, Sarathi-Serve) on a real paged-KV engine."""
import os

import torch

# Without a GPU the Triton kernels run in Triton's interpreter, which must be chosen before
# anything imports triton (transformers does, below).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ruff: noqa: E402
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.llm import LLM

__all__ = ["LLM", "ConfigError", "EngineConfig", "IterationRecord", "Metrics", "RequestRecord", "SamplingParams"]
