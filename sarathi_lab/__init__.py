"""sarathi_lab: measure chunked prefill (SARATHI, Sarathi-Serve) on a real paged-KV engine."""
from sarathi_lab.config import ConfigError, EngineConfig
from sarathi_lab.engine.metrics import IterationRecord, Metrics, RequestRecord
from sarathi_lab.engine.sequence import SamplingParams
from sarathi_lab.llm import LLM

__all__ = ["LLM", "ConfigError", "EngineConfig", "IterationRecord", "Metrics", "RequestRecord", "SamplingParams"]
